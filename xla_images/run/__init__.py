"""Running things: the engine, builds, checks, the smoke suite, registries, signatures, wheels over the network.

Everything that starts a process, talks to the Docker engine or a registry, or downloads lives here, on top of
the plan that `generate` makes, grouped by job: doctor > shipping > checking > building > packages | registry >
netread | engine (the `engine-bottom-of-run` contract in pyproject.toml). Only `run.engine` imports the docker SDK.
"""
