"""The two-phase use cases: the coordinator (commit and abort), recovery, visibility and the
survey of an exporter. Imports ``protocol`` and ``kafka``.
"""
