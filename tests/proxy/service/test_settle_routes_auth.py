"""Who may see the proxy's own routes (`/_settle/*`) when the upstream wants a password.

The proxy checks what a client presents against the credentials it was given
(`OPENCODE_SERVER_PASSWORD` / `OPENCODE_SERVER_USERNAME`), in both forms opencode accepts, and
never sends them upstream. Given none while the upstream answers 401, it cannot check anything,
so it shows nothing. `/_settle/up` answers anyone, with up or down and nothing else.
"""

import base64
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer, make_mocked_request
from yarl import URL

from proxy.service.app import ASSEMBLY, create_app
from proxy.service.auth import DetailsGuard, Lookup
from proxy.service.config import Settings, basic_authorization
from proxy.supervision.server_command import free_loopback_port
from tests.proxy.conftest import ProxyClient
from tests.proxy.fake_opencode import FakeOpencode

PASSWORD = "s3cret-Pa55"
GOOD = basic_authorization("opencode", PASSWORD)
TOKEN = base64.b64encode(f"opencode:{PASSWORD}".encode()).decode()
DETAILS = ("/_settle/health", "/_settle/metrics", "/_settle/orphans", "/_settle/nothing")
OPEN_STATUS = {
    "/_settle/health": 200,
    "/_settle/metrics": 200,
    "/_settle/orphans": 200,
    "/_settle/nothing": 404,
}
ClientFactory = Callable[[web.Application], Awaitable[ProxyClient]]
Presented = tuple[dict[str, str], dict[str, str]]

NONE: Presented = ({}, {})
WRONG: list[Presented] = [
    ({"Authorization": basic_authorization("opencode", PASSWORD + "x")}, {}),
    ({"Authorization": basic_authorization("someone", PASSWORD)}, {}),
    ({}, {"auth_token": base64.b64encode(b"opencode:nope").decode()}),
    ({"Authorization": f"Bearer {PASSWORD}"}, {}),
]
RIGHT: list[Presented] = [({"Authorization": GOOD}, {}), ({}, {"auth_token": TOKEN})]


def a_second_later(app: web.Application) -> None:
    """Age the proxy's reading of the upstream's health past its bound, so the next asker takes one."""
    health = app[ASSEMBLY].routes.reading
    before = health.clock
    health.clock = lambda: before() + health.max_age_s + 0.001


def _proxy_settings(upstream: TestServer, authorization: str | None) -> Settings:
    return Settings(upstream=URL(str(upstream.make_url("/"))), authorization=authorization)


@pytest.fixture
async def knowing(fake: FakeOpencode, upstream: TestServer, aiohttp_client: ClientFactory) -> ProxyClient:
    """The upstream wants a password, and the proxy was given it."""
    fake.password = PASSWORD
    return await aiohttp_client(create_app(_proxy_settings(upstream, GOOD)))


@pytest.fixture
async def unknowing(fake: FakeOpencode, upstream: TestServer, aiohttp_client: ClientFactory) -> ProxyClient:
    """The upstream wants a password, and the proxy was given none."""
    fake.password = PASSWORD
    return await aiohttp_client(create_app(_proxy_settings(upstream, None)))


async def _refused(proxy: ProxyClient, path: str, presented: Presented, status: int) -> None:
    headers, params = presented
    response = await proxy.get(path, headers=headers, params=params)
    assert response.status == status, (path, presented)
    body = await response.json()
    assert set(body) == {"error", "message"}, body
    text = await response.text()
    for detail in ("reachable", "127.0.0.1", "liveness", "settle_proxy_", '"orphans"', "version", "pid"):
        assert detail not in text, (path, text)


@pytest.mark.parametrize("path", DETAILS)
async def test_without_the_password_nothing_is_shown(knowing: ProxyClient, path: str) -> None:
    for presented in [NONE, *WRONG]:
        await _refused(knowing, path, presented, 401)
    response = await knowing.get(path)
    assert response.headers["WWW-Authenticate"] == 'Basic realm="settle-proxy"'


@pytest.mark.parametrize("path", DETAILS)
@pytest.mark.parametrize("presented", RIGHT, ids=["basic", "auth_token"])
async def test_the_upstreams_password_opens_them_by_basic_or_auth_token(
    knowing: ProxyClient, fake: FakeOpencode, path: str, presented: Presented
) -> None:
    headers, params = presented
    response = await knowing.get(path, headers=headers, params=params)
    assert response.status == OPEN_STATUS[path]
    assert not [r for r in fake.seen if r.path.startswith("/_settle")]
    # What the client presented stays here: the proxy's own look-ups carry its configured header only.
    assert not [r for r in fake.seen if "auth_token" in r.query]


def _settle_routes(app: web.Application) -> list[tuple[str, str]]:
    """(method, a path it answers) of every route the built application registers under `/_settle`."""
    found = []
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = str(info.get("path") or info.get("formatter", ""))
        if path.startswith("/_settle"):
            method = "GET" if route.method == "*" else route.method
            found.append((method, path.replace("{tail}", "anything-else")))
    return found


async def test_every_settle_route_but_the_probe_is_guarded(knowing: ProxyClient) -> None:
    """Walks the routes the application registers, so a route added anywhere is covered."""
    routes = _settle_routes(knowing.app)
    assert ("GET", "/_settle/resume") in routes
    assert ("GET", "/_settle/up") in routes
    for method, path in routes:
        if path == "/_settle/up":
            continue
        refused = await knowing.request(method, path)
        assert refused.status == 401, (method, path)
        if method != "HEAD":
            assert set(await refused.json()) == {"error", "message"}, (method, path)


async def test_the_health_of_a_knowing_proxy_says_its_credentials_work(knowing: ProxyClient) -> None:
    health = await (await knowing.get("/_settle/health", headers={"Authorization": GOOD})).json()
    assert health["upstream"]["reachable"] is True
    assert health["upstream"]["status"] != 401  # (the fake has no /global/health: 404)


@pytest.mark.parametrize("path", DETAILS)
async def test_a_proxy_without_the_password_shows_nothing_even_to_the_right_one(
    unknowing: ProxyClient, path: str
) -> None:
    """It cannot check credentials it does not know, and checking them upstream would lend the
    proxy's routes to anyone guessing the server's password."""
    for presented in [NONE, *WRONG, *RIGHT]:
        await _refused(unknowing, path, presented, 403)


async def _probe_says_up(proxy: ProxyClient) -> None:
    response = await proxy.get("/_settle/up")
    assert response.status == 200
    assert await response.json() == {"status": "up"}


async def test_the_probe_answers_anyone_with_up_and_nothing_else(knowing: ProxyClient) -> None:
    await _probe_says_up(knowing)


async def test_the_probe_answers_anyone_even_when_nothing_else_can_be_shown(unknowing: ProxyClient) -> None:
    await _probe_says_up(unknowing)


async def test_without_a_password_anywhere_everything_stays_open(
    upstream: TestServer, aiohttp_client: ClientFactory
) -> None:
    proxy = await aiohttp_client(create_app(_proxy_settings(upstream, None)))
    for path in DETAILS:
        assert (await proxy.get(path)).status == OPEN_STATUS[path], path
    assert await (await proxy.get("/_settle/up")).json() == {"status": "up"}


async def test_an_upstream_never_reached_opens_nothing_but_the_probe(aiohttp_client: ClientFactory) -> None:
    """Without credentials, whether the upstream wants a password is known only once it answers."""
    settings = Settings(upstream=URL(f"http://127.0.0.1:{free_loopback_port()}"), connect_timeout=2)
    proxy = await aiohttp_client(create_app(settings))
    for path in DETAILS:
        await _refused(proxy, path, NONE, 503)
    probe = await proxy.get("/_settle/up")
    assert (probe.status, await probe.json()) == (503, {"status": "down"})


async def test_an_open_upstream_that_goes_away_keeps_its_health_readable(
    fake: FakeOpencode, aiohttp_client: ClientFactory
) -> None:
    """Its last answer wanted no password: the health that says it is unreachable stays readable."""
    fake.events_refused = True  # no event stream, whose end the closing server would wait for
    upstream = TestServer(fake.app())
    await upstream.start_server()
    proxy = await aiohttp_client(create_app(_proxy_settings(upstream, None)))
    assert (await proxy.get("/_settle/health")).status == 200
    await upstream.close()
    a_second_later(proxy.app)
    down = await proxy.get("/_settle/health")
    assert down.status == 503
    assert (await down.json())["upstream"]["reachable"] is False


async def test_an_open_upstream_that_starts_asking_for_a_password_closes_them(
    fake: FakeOpencode, upstream: TestServer, aiohttp_client: ClientFactory
) -> None:
    proxy = await aiohttp_client(create_app(_proxy_settings(upstream, None)))
    assert (await proxy.get("/_settle/metrics")).status == 200
    fake.password = PASSWORD
    a_second_later(proxy.app)
    await _refused(proxy, "/_settle/metrics", NONE, 403)


async def test_an_upstream_that_let_the_proxys_own_stream_through_keeps_details_open_while_down(
    aiohttp_client: ClientFactory,
) -> None:
    """The proxy followed the upstream's events without credentials, then the upstream went away
    before anyone asked for details (a crash): that answer stands, as an answer to a look-up would."""

    async def unreachable(_: web.Request) -> Lookup:
        return Lookup(None, "it cannot be reached")

    async def details(_: web.Request) -> web.Response:
        return web.json_response({"upstream": {"reachable": False}}, status=503)

    guard = DetailsGuard(None, unreachable, behind_own_auth=False)
    app = web.Application()
    app.router.add_get("/_settle/health", guard.guard(details))
    client = await aiohttp_client(app)
    assert (await client.get("/_settle/health")).status == 503
    assert "error" in await (await client.get("/_settle/health")).json()  # unknown: nothing shown
    guard.following()
    assert await (await client.get("/_settle/health")).json() == {"upstream": {"reachable": False}}


async def test_a_proxy_given_the_password_still_checks_it_after_following() -> None:
    async def unreachable(_: web.Request) -> Lookup:
        return Lookup(None, "it cannot be reached")

    guard = DetailsGuard(GOOD, unreachable, behind_own_auth=False)
    guard.following()
    request = make_mocked_request("GET", "/_settle/health")
    refused = await guard.guard(_never_called)(request)
    assert refused.status == 401


async def _never_called(_: web.Request) -> web.StreamResponse:
    raise AssertionError("a refused request reached its handler")


@pytest.fixture
async def mistaken(fake: FakeOpencode, upstream: TestServer, aiohttp_client: ClientFactory) -> ProxyClient:
    """The upstream wants a password, and the proxy was given a wrong one."""
    fake.password = PASSWORD
    return await aiohttp_client(
        create_app(_proxy_settings(upstream, basic_authorization("opencode", "wrong")))
    )


async def _refused_for_the_proxys_credentials(
    proxy: ProxyClient, method: str, path: str, presented: Presented
) -> None:
    headers, params = presented
    response = await proxy.request(method, path, headers=headers, params=params)
    assert response.status == 403, (method, path, presented)
    if method == "HEAD":
        return
    said = await response.json()
    assert said["error"] == "forbidden"
    assert said["message"].startswith("the server refuses the proxy's credentials, so none are admitted here")
    assert "OPENCODE_SERVER_PASSWORD (on 2.x OPENCODE_PASSWORD) to the server's" in said["message"]


async def test_a_wrong_password_of_the_proxys_admits_no_one_to_any_route(mistaken: ProxyClient) -> None:
    """Whoever presents the proxy's credentials would be shown what the server refuses them, and
    without the server's own password the proxy cannot check anyone's: every route but the probe
    refuses everyone, saying why."""
    wrong_token = base64.b64encode(b"opencode:wrong").decode()
    proxys: list[Presented] = [
        ({"Authorization": basic_authorization("opencode", "wrong")}, {}),
        ({}, {"auth_token": wrong_token}),
    ]
    for method, path in _settle_routes(mistaken.app):
        if path == "/_settle/up":
            continue
        for presented in [*proxys, *RIGHT, NONE]:
            await _refused_for_the_proxys_credentials(mistaken, method, path, presented)
    await _probe_says_up(mistaken)


async def test_the_proxys_credentials_admit_again_once_the_server_lets_them_through(
    fake: FakeOpencode, knowing: ProxyClient
) -> None:
    """The server's password changed under the proxy (a restart with another), and back."""
    right = {"Authorization": GOOD}
    assert (await knowing.get("/_settle/metrics", headers=right)).status == 200
    fake.password = "another"
    a_second_later(knowing.app)
    await _refused_for_the_proxys_credentials(knowing, "GET", "/_settle/metrics", (right, {}))
    fake.password = PASSWORD
    a_second_later(knowing.app)
    assert (await knowing.get("/_settle/metrics", headers=right)).status == 200


async def test_credentials_other_than_those_the_server_let_through_are_not_the_servers(
    knowing: ProxyClient,
) -> None:
    assert (await knowing.get("/_settle/health", headers={"Authorization": GOOD})).status == 200
    response = await knowing.get("/_settle/health", headers=WRONG[0][0])
    assert response.status == 401
    assert (await response.json())["message"] == (
        "these are not the server's credentials: present the server's, as Basic or as ?auth_token="
    )


async def test_a_proxy_given_a_password_checks_it_before_the_upstream_ever_answered() -> None:
    """Not known yet whether the server takes them: the proxy's credentials admit (health then
    says why the upstream cannot be reached), anything else is refused, saying the proxy's may be
    the wrong ones."""

    async def unreachable(_: web.Request) -> Lookup:
        return Lookup(None)

    async def details(_: web.Request) -> web.Response:
        return web.json_response({"upstream": {"reachable": False}}, status=503)

    guard = DetailsGuard(GOOD, unreachable, behind_own_auth=False)
    admitted = await guard.guard(details)(
        make_mocked_request("GET", "/_settle/health", headers={"Authorization": GOOD})
    )
    assert admitted.status == 503
    wrong = make_mocked_request("GET", "/_settle/health", headers=WRONG[0][0])
    refused = await guard.guard(_never_called)(wrong)
    assert refused.status == 401
    assert b"if they are the server's, the proxy's are wrong" in refused.body  # type: ignore[attr-defined]
