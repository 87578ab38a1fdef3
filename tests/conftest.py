"""Shared test fixtures. Tests that need a real Docker engine are marked ``docker``; they run wherever one answers
(CI starts one) and fail loudly rather than skip when RECONCILER_REQUIRE_DOCKER=1."""
