"""What a pod is judged against, as the extender judges it: classes, groups with their
quotas, TenantQuotas and GPUPermissions, charged with what the counted decisions hold.

One reading for every controller part that must agree with the extender on whether a pod
may be placed (MIG on demand, ``migplanner``; preemption for remote slices,
``remotepreemptor``). What the extender leaves out, this leaves out: a class or group that
cannot be read (a pod naming it is refused), a TenantQuota that cannot be read (not
enforced); a GPUPermission that cannot be read permits its tenants nothing
(``permission_or_denial``). TenantQuotas are read with the namespaces their status
selected, as the extender reads them (``quota_of``), not as the controller is about to
write them, so that the controller never acts for a pod the extender would refuse.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpupool.contract.quotas import Broken as BrokenTenancy
from gpupool.contract.quotas import permission_or_denial, quota_of
from gpupool.contract.tenancy import Broken, class_of, group_of
from gpupool.controller.observed import Obj, Observed, name_of
from gpupool.controller.quotastatus import charged
from gpupool.core.classes import ClassCatalog
from gpupool.core.eligibility import Catalogue
from gpupool.core.groups import GroupCatalog
from gpupool.core.tenants import PermissionBook, TenantBook


def catalogue_of(observed: Observed, quotas: Iterable[Obj], permissions: Iterable[Obj]
                 ) -> Catalogue:
    """The catalogue the extender would judge pods against, from ``observed``'s classes
    and groups and the listed TenantQuota and GPUPermission objects."""
    classes = ClassCatalog(c for c in (class_of(o, name_of(o)) for o in observed.classes)
                           if not isinstance(c, Broken))
    book = charged(observed)
    groups = GroupCatalog()
    for obj in observed.groups:
        parsed = group_of(obj, name_of(obj))
        if not isinstance(parsed, Broken):
            groups.put(parsed[0])
            book.set_group_limit(parsed[0].name, parsed[1])
    tenants = TenantBook(q for q in map(quota_of, quotas) if not isinstance(q, BrokenTenancy))
    book_of_permissions = PermissionBook(p for p in map(permission_or_denial, permissions)
                                         if not isinstance(p, BrokenTenancy))
    return Catalogue(groups, classes, book, tenants, book_of_permissions)
