"""The `mounted-links` addon through `proxy.testing.cycle`."""

from multidict import CIMultiDict

from proxy import testing
from proxy.addons.mounted_links import MountedLinks, prefix_own_urls


async def test_mounted_links_get_the_prefix_on_the_proxys_own_origin_only() -> None:
    flow = testing.flow(
        "GET",
        "/session",
        headers={"Host": "proxy.test"},
        response_headers={
            "Link": '</session?cursor=2>; rel="next", <http://elsewhere.test/x>; rel="other"',
            "Location": "http://proxy.test/session/1",
            "Content-Location": "//proxy.test/x",
            "X-Other": "/session",
        },
    )
    await testing.cycle(MountedLinks("/opencode"), flow)
    assert dict(flow.response_headers) == {
        "Link": '</opencode/session?cursor=2>; rel="next", <http://elsewhere.test/x>; rel="other"',
        "Location": "http://proxy.test/opencode/session/1",
        "Content-Location": "//proxy.test/x",
        "X-Other": "/session",
    }


def test_an_origin_without_a_path_gets_one() -> None:
    headers = CIMultiDict({"Location": "https://proxy.test"})
    prefix_own_urls(headers, "https://proxy.test", "/oc")
    assert headers["Location"] == "https://proxy.test/oc/"
