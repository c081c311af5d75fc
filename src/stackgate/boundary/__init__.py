"""The boundary: where what stackgate reads from files becomes typed, frozen models.

Each file a suite or an earlier run wrote is validated here, once, by pydantic (strict: a string is
never a number, a boolean never a sample), with bounds on what it accepts (finite numbers, lengths,
nesting); what fails is a `Problem` naming the file, the line and the field. Past this package no
module reads evidence by string key.
"""
