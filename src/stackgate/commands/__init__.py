"""The commands: each a short sequence of the stages (`inputs`, `guards`, `runner`, `repeats`,
`conclude`, `rundir`): `run.run`, `dry_run.dry_run`, `calibrate.calibrate`, `merge.merge`, and
`bisect.run`, which steps through `run.run` over nightlies."""
