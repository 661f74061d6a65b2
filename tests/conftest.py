"""Settings for the whole suite."""

from __future__ import annotations

from hypothesis import HealthCheck, settings

# Property tests check what holds, never how fast: Hypothesis' per-example deadline (200 ms)
# and its too-slow health check would fail them on a loaded machine. A test's own
# @settings still applies on top of this profile.
settings.register_profile("gpupool", deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("gpupool")
