"""Operator-facing tools that ask a running cluster how it is and change it: `automq status` (and,
as they come, topics and groups). They talk to a cluster only through its public interfaces (the
controller API, brokers' /metrics, the Kafka protocol)."""
