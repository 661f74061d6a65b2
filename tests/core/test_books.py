"""NamedBook: the shared shape of the class, group and permission books."""

from __future__ import annotations

import pytest

from gpupool.core.classes import ClassCatalog, ResourceClass
from gpupool.core.errors import UnknownName
from gpupool.core.permissions import Permission, PermissionBook
from gpupool.core.selector import Selector


def test_a_book_replaces_by_name_and_forgets_on_remove() -> None:
    book = PermissionBook([Permission("a", frozenset({"ns1"}))])
    book.put(Permission("a", frozenset({"ns2"})))
    assert len(book) == 1 and "a" in book and book.get("a").tenants == {"ns2"}
    assert book.remove("a") is not None and book.remove("a") is None
    assert len(book) == 0 and "a" not in book and book.by_name == {}


def test_an_unknown_name_is_refused_with_the_known_names() -> None:
    catalog = ClassCatalog([ResourceClass("big", Selector()), ResourceClass("a", Selector())])
    with pytest.raises(UnknownName, match=r"^resource class x does not exist \(known: a, big\)$"):
        catalog.get("x")
    with pytest.raises(UnknownName, match=r"^GPUPermission x does not exist \(known: none\)$"):
        PermissionBook().get("x")
