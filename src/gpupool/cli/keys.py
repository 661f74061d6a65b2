"""``gpupool keys``: the keys that sign gpupool's decisions (show, rotate, retire).

  show                      key ids, when each may sign, which signs now, and how many
                            live decisions each one signed
  rotate --activate-after D add a key; it is published at once and signs after D
                            (e.g. 10m), once every node agent has read it
  retire KID                remove a key no live decision uses (--force: even then, for
                            a leaked key: those pods' decisions stop verifying)

Private keys are in Secret gpupool-decision-signing, public ones in ConfigMap
gpupool-decision-keys (both in --namespace). ``show`` falls back to the ConfigMap when
the Secret cannot be read. See docs/security.md ("Key and certificate rotation").
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from gpupool.cli.args import KUBECONFIG_HELP, SERVER_HELP, user_text
from gpupool.contract import annotations as records
from gpupool.contract import names
from gpupool.kube import keystore
from gpupool.kube.api import KubeApi
from gpupool.kube.errors import KubeError, NotFound
from gpupool.security.signing import KeyRing, SigningKeys

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``1d`` -> seconds."""
    match = _DURATION.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s, 10m or 2h, got "
                                         f"{text!r}")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("keys", help="show, rotate or retire decision signing keys",
                              description=user_text(__doc__),
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    _connection_flags(p, None, "gpupool-system")
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    show_p = sub.add_parser("show", help="list the keys and the live decisions each signed")
    rotate = sub.add_parser("rotate", help="add a key that signs after a delay")
    rotate.add_argument("--activate-after", type=duration, default=600.0, metavar="DURATION",
                        help="when the new key starts signing (default 10m); give node "
                             "agents time to read it (they re-read within 10 s of meeting it)")
    retire = sub.add_parser("retire", help="remove a key no live decision uses")
    retire.add_argument("kid", metavar="KID", help="the key id (16 hex digits, as show lists)")
    retire.add_argument("--force", action="store_true",
                        help="retire it even though live decisions use it (a leaked key)")
    for action in (show_p, rotate, retire):  # the options may also follow the action
        _connection_flags(action, argparse.SUPPRESS, argparse.SUPPRESS)
    p.set_defaults(func=run)


def _connection_flags(p: argparse.ArgumentParser, default: str | None, namespace: str) -> None:
    p.add_argument("--kubeconfig", metavar="FILE", default=default, help=KUBECONFIG_HELP)
    p.add_argument("--server", metavar="URL", default=default, help=SERVER_HELP)
    p.add_argument("--namespace", default=namespace,
                   help="gpupool's namespace (default gpupool-system)")


def run(args: argparse.Namespace) -> int:
    api = KubeApi.connect(kubeconfig=args.kubeconfig, server=args.server)
    try:
        if args.action == "show":
            return show(api, args.namespace)
        if args.action == "rotate":
            return rotate(api, args.namespace, args.activate_after)
        return retire(api, args.namespace, args.kid, args.force)
    finally:
        api.close()


def _stamp(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def live_signers(pods: Iterable[Any]) -> dict[str, list[str]]:
    """Key id -> the live pods (namespace/name) whose decision names it."""
    used: dict[str, list[str]] = {}
    for pod in pods:
        meta, status = pod.metadata, pod.status
        notes = (meta.annotations if meta else None) or {}
        if not records.has_decision(notes) or \
                notes.get(names.ANNOTATION_PHASE) == names.PHASE_FAILED or \
                (status is not None and status.phase in names.POD_TERMINAL_PHASES):
            continue
        parts = str(notes.get(names.ANNOTATION_SIGNATURE) or "").split(".")
        kid = parts[1] if len(parts) == 3 else "(unsigned)"
        used.setdefault(kid, []).append(f"{meta.namespace}/{meta.name}" if meta else "?")
    return used


def show(api: KubeApi, namespace: str) -> int:
    used = live_signers(api.list_pods().items)
    now = time.time()
    try:
        keys, _ = keystore.read_signing_keys(api, namespace)
        active = keys.active(now).kid if keys.keys else ""
        rows = [(k.kid, _stamp(k.not_before), "signing" if k.kid == active else
                 ("waits" if k.not_before > now else "verifies only")) for k in keys.keys]
    except KubeError as exc:
        print(f"note: the private keys cannot be read ({exc}); public keys only",
              file=sys.stderr)
        data, _ = api.get_config_map_data(namespace, keystore.PUBLIC_CONFIG_MAP)
        ring = KeyRing.from_data(data)
        rows = [(kid, "?", "published") for kid in sorted(ring.keys)]
    print(f"{'KEY':<18}{'NOT BEFORE':<22}{'STATE':<15}LIVE DECISIONS")
    for kid, since, state in rows:
        print(f"{kid:<18}{since:<22}{state:<15}{len(used.get(kid, []))}")
    known = {row[0] for row in rows}
    for kid, pods in sorted(used.items()):
        if kid not in known:
            print(f"{kid:<18}{'-':<22}{'not published':<15}{len(pods)} (e.g. {pods[0]}: "
                  "these decisions do not verify)")
    return 0


def rotate(api: KubeApi, namespace: str, delay_s: float) -> int:
    now = time.time()
    before = {k.kid for k in _keys(api, namespace).keys}
    after = keystore.rotate(api, namespace, now, delay_s)
    fresh = next(k for k in after.keys if k.kid not in before)
    print(f"added key {fresh.kid}: published now, signs from {_stamp(fresh.not_before)}")
    return 0


def retire(api: KubeApi, namespace: str, kid: str, force: bool) -> int:
    users = live_signers(api.list_pods().items).get(kid, [])
    if users and not force:
        shown = ", ".join(users[:5]) + (f" and {len(users) - 5} more" if len(users) > 5 else "")
        print(f"gpupool: key {kid} still signs {len(users)} live decisions ({shown}); "
              "retire it when they are gone, or with --force if the key leaked (their "
              "decisions then stop verifying)", file=sys.stderr)
        return 1
    keystore.retire(api, namespace, kid, time.time())
    print(f"retired key {kid}" + (f" ({len(users)} live decisions no longer verify)"
                                  if users else ""))
    return 0


def _keys(api: KubeApi, namespace: str) -> SigningKeys:
    try:
        return keystore.read_signing_keys(api, namespace)[0]
    except NotFound:
        return SigningKeys()
