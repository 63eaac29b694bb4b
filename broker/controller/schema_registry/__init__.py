"""A Confluent-compatible Schema Registry kept in the controller's metadata (docs/schema-registry.md)."""
