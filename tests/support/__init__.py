"""One kit of HTTP fakes for the unit tests, each written once and tested in tests/unit/test_support_fakes.py:

- host.Host: a recording host on 127.0.0.x (or ::1) that answers a route or a fixed status and records every
  request (method, path, headers with Authorization, body); scripted faults (a truncated body, a bounded stall);
  `forward`, a route that sends a request on to a real server (the engine suite's fronts). The engine suite's
  token realm, redirecting front and blob storage (tests/engine/registries_support.py) are Hosts too.
- registry.FakeRegistry: a Host that speaks the part of the Docker registry API v2 the unit tests need, with
  Basic or Bearer auth (its own token endpoint), redirects of blob and manifest reads, and scripted faults.
- index: a package index (PEP 691 JSON / PEP 503 HTML pages, range reads of wheels).
- matrices: matrix text several unit tests share (the 2.9.0 release block).

tests/ is on sys.path (pytest puts the rootdir conftest's folder there), so tests import `support.host` etc.
"""
