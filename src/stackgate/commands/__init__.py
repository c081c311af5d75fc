"""The commands: each a short sequence of the stages (`inputs`, `guards`, `runner`, `repeats`,
`conclude`, `rundir`): `run.run`, `dry_run.dry_run`, `calibrate.calibrate`, `merge.merge`; bisect
(`stackgate.bisect`) steps through `run.run`."""
