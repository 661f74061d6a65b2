"""The reviews metric's ``resource`` and ``operation`` labels come from request bodies,
which anyone reaching the webhook's port can write: over one kept-alive HTTPS connection, a
thousand made-up
resources and operations add one label value, ``other``, and the real ones keep their
names; the names known are exactly what the shipped webhook configurations send."""

from __future__ import annotations

from pathlib import Path

import yaml

from gpupool.webhook.metrics import OPERATIONS, OTHER, RESOURCES

from .builders import body, pod, review
from .conftest import Webhook, post_on

WEBHOOKS = Path(__file__).parents[2] / "deploy" / "webhook" / "webhooks.yaml"


def label_values(webhook: Webhook, label: str) -> set[str]:
    family = next(f for f in webhook.metrics.registry.collect()
                  if f.name == "gpupool_webhook_reviews")
    return {s.labels[label] for s in family.samples if s.name.endswith("_total")}


def test_made_up_resources_and_operations_are_counted_as_other(webhook: Webhook) -> None:
    with webhook.kept_alive() as conn:
        for k in range(1000):
            status, _ = post_on(conn, "/validate", body(review(
                pod(), resource=f"made-up-{k}", operation=f"OP{k}", uid=f"u{k}")))
            assert status == 200
    webhook.post("/validate", body(review(pod(), resource="pods", operation="CREATE")))
    assert label_values(webhook, "resource") == {OTHER, "pods"}
    assert label_values(webhook, "operation") == {OTHER, "CREATE"}
    assert webhook.metrics.registry.get_sample_value(
        "gpupool_webhook_reviews_total", {"endpoint": "validate", "resource": OTHER,
                                          "operation": OTHER, "outcome": "allowed"}) == 1000


def test_the_known_names_are_what_the_shipped_configurations_send() -> None:
    rules = [rule for doc in yaml.safe_load_all(WEBHOOKS.read_text()) if doc
             for hook in doc["webhooks"] for rule in hook["rules"]]
    assert {r for rule in rules for r in rule["resources"]} == RESOURCES
    assert {o for rule in rules for o in rule["operations"]} <= OPERATIONS
