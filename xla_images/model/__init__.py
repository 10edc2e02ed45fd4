"""The model: what the matrix declares and where this site builds it. Pure data and validation.

`matrix` reads matrix.yaml into validated `Flavour`s (no site needed), `site` reads the site settings, and
`target` binds each flavour to the site (wheel source, base image) as a `Target`, whose content-addressed id
the plan fills in. `registry` is the HOST[:PORT]/REPOSITORY grammar, `lockfile` the lock format and its inputs,
`nightly` pins a nightly target to the night its lock names. Nothing here renders files, runs a process or
talks to an engine or a registry.
"""
