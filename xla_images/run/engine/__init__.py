"""The Docker engine, through the docker SDK and the docker CLI's buildx: the only package that imports `docker`.

Everything else speaks in image references, ids, labels and paths; engine errors a user can cause (no engine,
a missing image) become `Failure`s with a hint, never SDK tracebacks. Split by concern:

  connection  the client (DOCKER_HOST), engine facts, how SDK errors read
  images      inspect, labels, layers, history, tag/untag, import, save, remove
  stored      what the containerd store holds of an image: its layers' media types (compression)
  containers  run a command, keep one running, copy files in and out (each labelled and always removed)
  builds      what a build leaves behind, and removing it
  classic     the classic builder (streamed, abortable) and plain directory builds
  buildkit    `docker buildx build` / `bake` as subprocesses
  transfer    push and pull
"""
from . import buildkit, builds, classic, connection, containers, images, stored, transfer

__all__ = ["buildkit", "builds", "classic", "connection", "containers", "images", "stored", "transfer"]
