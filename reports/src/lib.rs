//! Statistics, SLO checks, capacity plans, A/B tests and renderers for loadgen runs.
