"""What the measurements mean: the outcome rules and verdicts (verdict) against the scenario's expectations
(expectations), the speed rule (speed) and its statistics (stats), the workers' fingerprints read (weights), failures
classified (crashes), and a variant's record made its result (assemble). Pure: no server, no file.
"""
