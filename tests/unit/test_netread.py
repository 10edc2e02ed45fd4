"""run.netread against a real misbehaving server on 127.0.0.1 (rude_server): an overall deadline that bites at
the socket while the server dribbles its headers or body (one byte every 0.3 s against a per-read timeout of
30 s), bodies bounded as they stream, cut and broken bodies as Failures. Deadlines are 1 s, set by parameter."""
from __future__ import annotations

import ssl
from pathlib import Path
from typing import Callable, Iterator

import pytest
import requests

from rude_server import Exchange, RudeServer, answer
from support.host import server_context
from xla_images.errors import Failure
from xla_images.run import netread

PER_READ = (5.0, 30.0)  # requests' timeout: each read alone would wait 30 s, the dribble never trips it


@pytest.fixture
def rude() -> Iterator[Callable[[Callable[[Exchange], None]], RudeServer]]:
    started: list[RudeServer] = []

    def start(script: Callable[[Exchange], None], context: ssl.SSLContext | None = None) -> RudeServer:
        started.append(RudeServer(script, context))
        return started[-1]

    yield start
    for server in started:
        server.close()


def session() -> requests.Session:
    made = requests.Session()
    made.trust_env = False  # the machine's proxy is not between the test and 127.0.0.1
    made.mount("http://", netread.DeadlineAdapter())
    made.mount("https://", netread.DeadlineAdapter())
    return made


def fetch(server: RudeServer, seconds: float = 1.0, limit: int = 1 << 20, rule: str = "registry-slow",
          ca: Path | None = None) -> bytes:
    with netread.deadline(seconds, host=server.host, what="GET /x", rule=rule):
        response = session().get(f"{'https' if ca else 'http'}://{server.host}/x", timeout=PER_READ, stream=True,
                                 verify=str(ca) if ca else True)
        return netread.read_body(response, limit, host=server.host, what="GET /x")


def test_a_server_dribbling_its_headers_is_cut_at_the_deadline(rude) -> None:
    server = rude(lambda exchange: exchange.dribble(answer(200, {}, b"ok"), every=0.3))
    with pytest.raises(Failure) as caught:
        fetch(server)
    assert caught.value.rule == "registry-slow"
    assert server.host in caught.value.message and "GET /x" in caught.value.message and "1 s" in caught.value.message


def test_a_server_dribbling_its_body_is_cut_at_the_deadline(rude) -> None:
    def script(exchange: Exchange) -> None:
        exchange.send(answer(200, {}, length=30))
        exchange.dribble(b"b" * 30, every=0.3)

    with pytest.raises(Failure) as caught:
        fetch(rude(script))
    assert caught.value.rule == "registry-slow"


def test_the_caller_names_the_rule(rude) -> None:
    server = rude(lambda exchange: exchange.dribble(answer(200, {}, b"ok"), every=0.3))
    with pytest.raises(Failure) as caught:
        fetch(server, rule="index-slow")
    assert caught.value.rule == "index-slow"


def test_deadlines_nest_and_the_earliest_end_applies(rude) -> None:
    server = rude(lambda exchange: exchange.dribble(answer(200, {}, b"b" * 10), every=0.3))
    with pytest.raises(Failure) as caught:
        with netread.deadline(1.0, host=server.host, what="the command", rule="registry-slow"):
            fetch(server, seconds=600.0, rule="inner-rule")
    assert caught.value.rule == "registry-slow" and "the command" in caught.value.message


def test_a_prompt_answer_inside_a_deadline_is_read_whole(rude) -> None:
    server = rude(lambda exchange: exchange.send(answer(200, {}, b"hello" * 1000)))
    assert fetch(server) == b"hello" * 1000
    assert netread.current() is None  # the block's deadline is gone after it


def test_an_endless_body_is_refused_at_the_limit(rude) -> None:
    def script(exchange: Exchange) -> None:
        exchange.send(answer(200, {"Transfer-Encoding": "chunked"}))
        exchange.endless(b"10000\r\n" + b"x" * 0x10000 + b"\r\n")

    with pytest.raises(Failure) as caught:
        fetch(rude(script), seconds=30.0, limit=1 << 20)
    assert caught.value.rule == "registry-answer" and str(1 << 20) in caught.value.message


def test_a_declared_length_over_the_limit_is_refused_before_reading(rude) -> None:
    server = rude(lambda exchange: exchange.send(answer(200, {}, length=10 << 30)))
    with pytest.raises(Failure, match="10737418240 bytes, at most 1024"):
        fetch(server, limit=1024)


def test_a_body_shorter_than_its_content_length_is_a_failure(rude) -> None:
    def script(exchange: Exchange) -> None:
        exchange.send(answer(200, {}, b"short", length=1000))
        exchange.conn.close()

    with pytest.raises(Failure) as caught:
        fetch(rude(script))
    assert caught.value.rule == "registry-answer" and "broke off" in caught.value.message


def test_a_broken_gzip_body_is_a_failure(rude) -> None:
    broken = b"\x1f\x8b\x08\x00" + b"\xff" * 200  # a gzip header, then not deflate
    server = rude(lambda exchange: exchange.send(answer(200, {"Content-Encoding": "gzip"}, broken)))
    with pytest.raises(Failure) as caught:
        fetch(server)
    assert caught.value.rule == "registry-answer"


def test_an_answer_that_closes_the_connection_is_read_whole(rude) -> None:
    def script(exchange: Exchange) -> None:
        exchange.send(answer(200, {"Connection": "close"}, length=400_000))
        exchange.dribble(b"", every=0.2)  # the headers arrive alone; http.client closes its connection then
        exchange.send(b"last" * 100_000)
        exchange.conn.close()

    assert fetch(rude(script)) == b"last" * 100_000


def tls_server(rude, certificate: Path, script: Callable[[Exchange], None]) -> RudeServer:
    context = server_context(certificate)
    return rude(script, context)


def test_over_tls_a_prompt_answer_is_read_and_a_dribbling_one_is_cut(rude, certificate: Path) -> None:
    prompt = tls_server(rude, certificate,
                        lambda exchange: exchange.send(answer(200, {"Connection": "close"}, b"t" * 9)))
    assert fetch(prompt, ca=certificate / "cert.pem") == b"t" * 9
    slow = tls_server(rude, certificate, lambda exchange: exchange.dribble(answer(200, {}, b"ok"), every=0.3))
    with pytest.raises(Failure) as caught:
        fetch(slow, ca=certificate / "cert.pem")
    assert caught.value.rule == "registry-slow"
