"""Building images: the build of a flavour (build), one build per tag at a time (build_mutex), the
build context (context, check_tool), the base image (base), the bake file's context (bake), build's
threads (workers).
"""
