"""Decision verifier benchmark (not a test: it prints figures).

The extender, node agents and the controller check decisions through one
``gpupool.kube.verifier.DecisionVerifier``. This measures, over ``--decisions`` signed
decisions (the annotations the extender writes, ~280 signed bytes each):

* a check answered from the memo (what every Allocate does for the node's other
  decisions, and every controller round and extender rebuild for every pod), against
  two baselines of the same run: one Ed25519 check of the same decision (what the
  memo saves) and building the decision's claims alone (``claims_of``, the least any
  check must do);
* the first round after the key ring changed (everything is checked again), against
  the Ed25519 checks alone;
* memory per remembered outcome (``tracemalloc``), for verified decisions and for
  refusals (which keep their sentence), with allocations of 300 and 20,000 characters:
  the memo keys on a digest, so the size of the allocation must not matter.

    .venv/bin/python bench/bench_verifier.py [--decisions 2000]
"""

from __future__ import annotations

import argparse
import contextlib
import time
import tracemalloc
from collections.abc import Callable

from gpupool.contract import names
from gpupool.kube.verifier import DecisionVerifier
from gpupool.security.signing import SignatureError, SigningKeys, claims_of

from machine import line as machine_line

KEYS = SigningKeys().added(0.0)


def decisions(n: int, allocation_chars: int = 300, keys: SigningKeys | None = KEYS
              ) -> list[tuple[str, dict[str, str]]]:
    """(uid, annotations) of ``n`` decisions signed for pods ``p<i>`` in ``team-a``."""
    out = []
    for i in range(n):
        uid = f"uid-{i:08d}"
        notes = {names.ANNOTATION_NODE: f"node-{i % 500}",
                 names.ANNOTATION_BIND_TIME: "2026-11-23T10:00:00.000000Z",
                 names.ANNOTATION_ALLOCATION: '{"x":"' + "a" * allocation_chars + '"}'}
        if keys is not None:
            notes[names.ANNOTATION_SIGNATURE] = keys.active(1.0).sign(
                claims_of(uid, "team-a", f"p{i}", notes))
        out.append((uid, notes))
    return out


def per_item(run: Callable[[], object], n: int, repeat: int = 5) -> float:
    """Seconds per item, the best of ``repeat`` runs over ``n`` items."""
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best / n


def check_all(v: DecisionVerifier, ds: list[tuple[str, dict[str, str]]]) -> None:
    for i, (uid, notes) in enumerate(ds):
        with contextlib.suppress(SignatureError):  # refusals are measured too
            v.verify(uid, "team-a", f"p{i}", notes, notes.get(names.ANNOTATION_SIGNATURE))


def speed(n: int) -> None:
    ring = KEYS.public()
    ds = decisions(n)
    v = DecisionVerifier(lambda wanted: ring)
    check_all(v, ds)
    remembered = per_item(lambda: check_all(v, ds), n)
    claims = [claims_of(uid, "team-a", f"p{i}", notes) for i, (uid, notes) in enumerate(ds)]
    sigs = [notes[names.ANNOTATION_SIGNATURE] for _, notes in ds]
    ed = per_item(lambda: [ring.verify(c, s) for c, s in zip(claims, sigs, strict=True)], n, 2)
    build = per_item(lambda: [claims_of(uid, "team-a", f"p{i}", notes)
                              for i, (uid, notes) in enumerate(ds)], n)
    print(f"{n} decisions: remembered check {remembered * 1e6:.2f} us; baselines: one Ed25519 "
          f"check {ed * 1e6:.0f} us (x{ed / remembered:.0f} the remembered one), building the "
          f"claims alone {build * 1e6:.2f} us (remembered / claims = {remembered / build:.1f})")
    held = [ring]
    after = DecisionVerifier(lambda wanted: held[0])
    check_all(after, ds)
    held[0] = SigningKeys((*KEYS.keys, *SigningKeys().added(0).keys)).public()  # a key
    # rotated in: everything is checked again
    start = time.perf_counter()
    check_all(after, ds)
    again = (time.perf_counter() - start) / n
    print(f"first round after the ring changed: {again * 1e6:.0f} us per decision "
          f"(Ed25519 alone {ed * 1e6:.0f} us: x{again / ed:.2f}); forgotten "
          f"{after.stats().forgotten} time(s), {after.stats().size} outcomes now")


def memory(n: int) -> None:
    for chars in (300, 20_000):
        for label, keys in (("verified", KEYS), ("refused", None)):
            ds = decisions(n, chars, keys)
            ring = KEYS.public()
            v = DecisionVerifier(lambda wanted, r=ring: r)
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
            check_all(v, ds)
            used = tracemalloc.get_traced_memory()[0] - before
            tracemalloc.stop()
            print(f"memory, {label}, allocation of {chars} characters: "
                  f"{used / len(v):.0f} bytes per remembered outcome ({len(v)} outcomes)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--decisions", type=int, default=2000)
    args = parser.parse_args()
    print(machine_line("before"))
    speed(args.decisions)
    memory(args.decisions)
    print(machine_line("after"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
