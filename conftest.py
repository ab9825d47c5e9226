"""Settings shared by every test directory.

Hypothesis' per-example deadline (200 ms) turns a busy CI machine into
flaky failures that say nothing about the code; the properties are what
the tests assert, so the deadline is off everywhere.
"""

from hypothesis import HealthCheck, settings

settings.register_profile("otelbpf", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("otelbpf")
