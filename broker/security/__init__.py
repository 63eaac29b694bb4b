"""Security pieces shared by the Kafka layer and the controller: TLS contexts that reload
their certificates, certificate principals and their mapping rules, SASL mechanisms as
sans-I/O state machines (PLAIN, SCRAM, OAUTHBEARER) and the controller API's token.

Nothing here touches a socket: the Kafka server (`automq.broker.kafka.server`) and the
controller's HTTP server and client feed these objects bytes and act on their answers."""
