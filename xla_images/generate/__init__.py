"""Generation: the files xla-images writes from the model, and the check that the committed ones are current.

`render` (Dockerfiles, wheel-build parameters) and `cigen` (GitHub workflows, the bake file) are pure: a
flavour in, text out, the same bytes on every site. `plan` ties model and renders together (flavours bound to
the site, rendered files, ids). `sync` is the one place that compares generated files with the disk and writes
them. Nothing here builds, runs or pushes anything.
"""
