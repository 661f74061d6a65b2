"""Test support for gpupool: FAKES that stand in for real components in tests and
benchmarks. Not part of the product: it is not installed by ``pip install gpupool`` nor
shipped in the container image, and product code must not import it (checked by
``tests/test_layers.py``). Tests find it through pytest's ``pythonpath``; benchmarks add
``testing/`` to ``sys.path`` themselves.

* ``fake_apiserver.FakeApiServer`` — a FAKE in-memory Kubernetes API server on
  127.0.0.1 (the one test seam in front of the real API), over
  ``fake_store.Store`` (objects, watch history, selectors, merge patch).
* ``rawhttp`` — not a fake: a bare HTTP/1.1 client that sends a body in chosen pieces
  and reads the answer with llhttp (fuzz tests and benchmarks of the HTTP servers).
"""

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The ``testing/`` folder (put it on ``PYTHONPATH`` of child processes that import this)."""
