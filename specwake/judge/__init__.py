"""What the measurements mean: the outcome rules and verdicts (verdict) against the scenario's expectations
(expectations), the speed rule (speed) and its statistics (stats), the workers' fingerprints read (weights), failures
classified (crashes), and the sequential test that stops a stage once it is decided (sequential). Pure: no server, no
file, and nothing of prepare or run: a rule takes the values it decides on.
"""
