"""The pure protocol: records, replay, outcomes, naming, committables, window arithmetic.

Nothing here talks to Kafka: every module is plain data and rules, importable anywhere. The core's
exceptions live in ``errors.py``.
"""
