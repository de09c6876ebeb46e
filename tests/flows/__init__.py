"""Flow modules the test workers import (RUNNER_FLOW_MODULES)."""
