"""Which credentials an upstream call carries: the client's own, else the configured ones."""

from proxy import testing
from proxy.opencode.client import AUTH_TOKEN_PARAM, Credentials


def test_the_clients_header_then_its_token_then_the_configured_header() -> None:
    header = testing.flow(headers={"Authorization": "Basic own"}).request
    assert Credentials.for_request(header, "Basic configured").headers == {"Authorization": "Basic own"}
    token = testing.flow(path=f"/x?{AUTH_TOKEN_PARAM}=abc").request
    assert Credentials.for_request(token, "Basic configured") == Credentials(params={AUTH_TOKEN_PARAM: "abc"})
    bare = testing.flow().request
    assert Credentials.for_request(bare, "Basic configured").headers == {"Authorization": "Basic configured"}
    assert Credentials.for_request(bare, None) == Credentials()
