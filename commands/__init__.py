"""The top floor: every command a user or a run starts, and nothing else imports.

`forgive` (forgive: run, compare, study, impact, clean), `forgive-ctl` (ctl),
`forgive-switch` (switch), `forgive-agent` (agent), `forgive-train` (train) and
`forgive-dissect` (dissect). Each parses its options, builds what it needs from
the packages below and runs it; the layers contract in pyproject.toml keeps
every other package from importing this one.
"""
