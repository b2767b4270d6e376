"""The Kafka clients: configuration, access checks, the wire client (EndTxn and the transaction
queries), the decision topic, the librdkafka adapter and the producers. Imports ``protocol`` only.
"""
