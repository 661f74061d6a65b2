"""ResourceClass and ResourceGroup objects -> core values, or the reason they are broken.

The reader is shared with the admission webhook (``gpupool.contract.tenancy``), so the
status the controller writes and the refusal the webhook gives say the same thing.
"""

from __future__ import annotations

from gpupool.contract.tenancy import Broken, class_of, group_of

__all__ = ["Broken", "class_of", "group_of"]
