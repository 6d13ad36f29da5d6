"""Principals, the ACL file and the tokens file (tidewire.hub.access): pure, no sockets.

Tables of (principal, action, stream) -> allowed; malformed files name themselves in the
error; tokens minted, parsed and checked against an injected clock; a Hypothesis property
for the two extreme ACLs.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidewire.hub import RESERVED_PREFIX
from tidewire.hub.access import (
    ANONYMOUS,
    Access,
    AccessFileError,
    Acl,
    Action,
    Principal,
    Tokens,
    certificate_name,
    certificate_principal,
    mint_token,
)
from tidewire.model import Forbidden, Unauthenticated

ACL = """
[principal."token:ci"]
read = ["*"]
write = ["clicks.*", "orders"]

[principal."cert:*"]
read = ["shared.*"]

[principal."cert:alice"]
read = ["alice.*"]
write = ["alice.inbox"]

[principal.anonymous]
read = ["public.*"]

[principal."token:team-[ab]"]
read = ["team.[ab]?", "lit[*]"]

[principal."token:?"]
write = ["short"]

[principal."token:ops"]
read = ["_tidewire.txns"]

[principal."token:root"]
read = ["*", "_tidewire*"]

[principal."token:under"]
read = ["_*"]
"""

# (principal, action, stream, allowed)
CASES: list[tuple[str, Action, str, bool]] = [
    ("token:ci", "read", "anything", True),
    ("token:ci", "read", "clicks.eu", True),
    ("token:ci", "write", "clicks.eu", True),
    ("token:ci", "write", "clicks", False),  # "clicks.*" needs the dot
    ("token:ci", "write", "orders", True),
    ("token:ci", "write", "orders2", False),
    ("token:CI", "read", "anything", False),  # case-sensitive (fnmatchcase)
    # principal globs: every cert holder reads shared.*, alice gets the union of both tables
    ("cert:bob", "read", "shared.x", True),
    ("cert:bob", "read", "alice.x", False),
    ("cert:alice", "read", "shared.x", True),
    ("cert:alice", "read", "alice.x", True),
    ("cert:alice", "write", "alice.inbox", True),
    ("cert:alice", "write", "shared.x", False),
    ("cert:", "read", "shared.x", True),  # "*" matches the empty CN too
    ("anonymous", "read", "public.news", True),
    ("anonymous", "read", "shared.x", False),
    ("anonymous", "write", "public.news", False),
    # [ patterns, in principal keys and in stream globs
    ("token:team-a", "read", "team.a1", True),
    ("token:team-b", "read", "team.bz", True),
    ("token:team-c", "read", "team.a1", False),
    ("token:team-a", "read", "team.c1", False),
    ("token:team-a", "read", "team.a", False),  # ? needs one character
    ("token:team-a", "read", "lit*", True),  # [*] is a literal star
    ("token:team-a", "read", "litx", False),
    ("token:x", "write", "short", True),
    ("token:xy", "write", "short", False),
    # no table matches: refused
    ("token:nobody", "read", "public.news", False),
    ("tokenci", "read", "x", False),
    # "*" is every client stream, not the hub's own (_tidewire.*) unless a pattern names them
    ("token:ci", "read", "_tidewire.txns", False),
    ("token:ci", "read", "_tidewire.tolliver", False),
    ("token:ci", "read", "_tidewire", True),  # (no dot: not the reserved prefix)
    ("token:ci", "read", "_other", True),
    ("token:ops", "read", "_tidewire.txns", True),
    ("token:ops", "read", "_tidewire.tolliver", False),
    ("token:root", "read", "_tidewire.tolliver", True),
    ("token:root", "read", "orders", True),
    ("token:under", "read", "_tidewire.txns", False),  # "_*" does not name the prefix
    ("token:under", "read", "_x", True),
]


@pytest.mark.parametrize(("principal", "action", "stream", "allowed"), CASES)
def test_acl_globs(principal: str, action: Action, stream: str, allowed: bool) -> None:
    acl = Acl.parse(ACL)
    assert acl.allows(Principal(principal), action, stream) is allowed
    assert acl.allows(Principal(principal), action, stream) is allowed  # cached, the same
    access = Access(acl)
    assert access.may(Principal(principal), action, stream) is allowed
    if allowed:
        access.check(Principal(principal), action, stream)
    else:
        with pytest.raises(Forbidden, match=rf"^{principal} may not {action} stream '"):
            access.check(Principal(principal), action, stream)


def test_unclosed_bracket_is_a_literal() -> None:
    acl = Acl.parse('[principal."token:["]\nread = ["a[", "[b"]\n')
    assert acl.allows(Principal("token:["), "read", "a[")
    assert acl.allows(Principal("token:["), "read", "[b")
    assert not acl.allows(Principal("token:["), "read", "ab")
    assert not acl.allows(Principal("token:x"), "read", "a[")


def test_negated_bracket() -> None:
    acl = Acl.parse('[principal."*"]\nread = ["[!_]*"]\n')
    assert acl.allows(ANONYMOUS, "read", "orders")
    assert not acl.allows(ANONYMOUS, "read", "_tidewire.txns")


def test_open_access_allows_everything_and_lists_all() -> None:
    access = Access()
    assert access.open
    access.check(ANONYMOUS, "write", "anything")
    assert access.streams(ANONYMOUS, ["b", "a"]) == ["b", "a"]
    assert not Access(Acl()).open


def test_streams_lists_only_readable() -> None:
    access = Access(Acl.parse(ACL))
    names = ["public.a", "shared.b", "alice.c", "orders"]
    assert access.streams(ANONYMOUS, names) == ["public.a"]
    assert access.streams(Principal("cert:alice"), names) == ["shared.b", "alice.c"]
    assert access.streams(Principal("token:ci"), names) == names


def test_empty_acl_file_refuses_everything() -> None:
    acl = Acl.parse("")
    assert acl.grants == ()
    assert not acl.allows(ANONYMOUS, "read", "x")
    with pytest.raises(Forbidden):
        Access(acl).check(Principal("token:ci"), "write", "x")


def test_read_only_and_write_only_tables() -> None:
    acl = Acl.parse('[principal.a]\nread = ["r"]\n[principal.b]\nwrite = ["w"]\n[principal.c]\n')
    assert acl.allows(Principal("a"), "read", "r")
    assert not acl.allows(Principal("a"), "write", "r")
    assert acl.allows(Principal("b"), "write", "w")
    assert not acl.allows(Principal("b"), "read", "w")
    assert not acl.allows(Principal("c"), "read", "r")


MALFORMED_ACLS = [
    ("[principal.a\n", "<acl>"),  # not TOML
    ('[principals.a]\nread = ["x"]\n', "unknown table"),
    ("principal = 5\n", "table of tables"),
    ('[principal]\na = ["x"]\n', "only 'read' and 'write'"),
    ('[principal.a]\nread = ["x"]\nadmin = true\n', "admin must be a list of globs"),
    ('[principal.a]\nread = ["x"]\nsuper = true\n', "only 'read' and 'write'"),
    ('[principal.a]\nread = "x"\n', "read must be a list of globs"),
    ("[principal.a]\nwrite = [1]\n", "write must be a list of globs"),
    ('[principal.a]\nread = [""]\n', "read must be a list of globs"),
]


@pytest.mark.parametrize(("text", "words"), MALFORMED_ACLS)
def test_malformed_acl_names_the_file(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(AccessFileError, match=r"^<acl>: ") as info:
        Acl.parse(text)
    assert words in str(info.value)
    path = tmp_path / "acl.toml"
    path.write_text(text)
    with pytest.raises(AccessFileError, match=f"^{re.escape(str(path))}: "):
        Acl.load(str(path))


def test_unreadable_files_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    with pytest.raises(AccessFileError, match=f"cannot read {re.escape(str(missing))}"):
        Acl.load(str(missing))
    with pytest.raises(AccessFileError, match=f"cannot read {re.escape(str(missing))}"):
        Tokens.load(str(missing))
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(AccessFileError, match=f"cannot read {re.escape(str(binary))}"):
        Tokens.load(str(binary))
    good = tmp_path / "acl.toml"
    good.write_text(ACL)
    assert Acl.load(str(good)) == Acl.parse(ACL)


HEX = "ab" * 32
MALFORMED_TOKENS = [
    ('[token."ci"\n', "<tokens>"),  # not TOML
    (f'[tokens.ci]\nsha256 = "{HEX}"\n', "tables only"),
    ("token = 1\n", "tables only"),
    ("[token]\nci = 1\n", "keys are sha256 and expires"),
    (f'[token.ci]\nsha256 = "{HEX}"\nowner = "me"\n', "keys are sha256 and expires"),
    ("[token.ci]\n", "64 hex digits"),
    ('[token.ci]\nsha256 = "abcd"\n', "64 hex digits"),
    (f'[token.ci]\nsha256 = "{"zz" * 32}"\n', "64 hex digits"),
    ("[token.ci]\nsha256 = 5\n", "64 hex digits"),
    (f'[token.ci]\nsha256 = "{HEX}"\nexpires = "tomorrow"\n', "must be a date-time"),
    (f'[token.ci]\nsha256 = "{HEX}"\nexpires = 2030-01-01\n', "must be a date-time"),
]


@pytest.mark.parametrize(("text", "words"), MALFORMED_TOKENS)
def test_malformed_tokens_names_the_file(tmp_path: Path, text: str, words: str) -> None:
    with pytest.raises(AccessFileError, match=r"^<tokens>: ") as info:
        Tokens.parse(text)
    assert words in str(info.value)
    path = tmp_path / "tokens.toml"
    path.write_text(text)
    with pytest.raises(AccessFileError, match=f"^{re.escape(str(path))}: "):
        Tokens.load(str(path))


# --------------------------------------------------------------------------- tokens

NOW = 1_800_000_000.0  # a fixed clock


def test_mint_and_parse_round_trip(tmp_path: Path) -> None:
    token, table = mint_token("ci")
    name, secret = token.split(".", 1)
    assert name == "ci"
    assert len(secret) >= 40
    assert secret not in table  # only the digest is kept
    assert hashlib.sha256(token.encode()).hexdigest() in table
    tokens = Tokens.parse(table)
    assert tokens.by_name["ci"].expires is None
    assert tokens.authenticate(token, NOW) == Principal("token:ci")
    path = tmp_path / "tokens.toml"
    path.write_text(table)
    access = Access(tokens=Tokens.load(str(path)), clock=lambda: NOW)
    assert access.authenticate(token) == Principal("token:ci")
    assert access.authenticate(None) is ANONYMOUS


def test_several_tokens_in_one_file_and_dotted_names() -> None:
    ci, ci_table = mint_token("ci")
    dotted, dotted_table = mint_token("team.etl")
    tokens = Tokens.parse(ci_table + "\n" + dotted_table)
    assert set(tokens.by_name) == {"ci", "team.etl"}
    assert tokens.authenticate(ci, NOW) == Principal("token:ci")
    assert tokens.authenticate(dotted, NOW) == Principal("token:team.etl")
    # a token is tied to its name: ci's secret does not work under another name
    with pytest.raises(Unauthenticated, match=r"claimed token:team\.etl"):
        tokens.authenticate("team.etl." + ci.split(".", 1)[1], NOW)


def test_mint_refuses_names_that_would_break_the_file() -> None:
    for name in ["", "a b", 'a"b', "a\\b", "tab\there"]:
        with pytest.raises(ValueError, match="token name"):
            mint_token(name)


def test_wrong_secret_names_the_claimed_principal() -> None:
    token, table = mint_token("ci")
    tokens = Tokens.parse(table)
    with pytest.raises(Unauthenticated, match=r"^invalid token \(claimed token:ci\)$"):
        tokens.authenticate(token + "x", NOW)
    with pytest.raises(Unauthenticated, match=r"claimed token:ci\)"):
        tokens.authenticate("ci.wrong", NOW)


def test_unknown_name() -> None:
    _, table = mint_token("ci")
    tokens = Tokens.parse(table)
    other, _ = mint_token("other")
    with pytest.raises(Unauthenticated, match=r"claimed token:other\)"):
        tokens.authenticate(other, NOW)
    with pytest.raises(Unauthenticated, match="invalid token"):
        Tokens().authenticate(other, NOW)


@pytest.mark.parametrize("token", ["nodot", "", ".secret", "ci.", "."])
def test_malformed_token(token: str) -> None:
    _, table = mint_token("ci")
    with pytest.raises(Unauthenticated, match=r"claimed a malformed token"):
        Tokens.parse(table).authenticate(token, NOW)


def test_expiry_with_an_injected_clock() -> None:
    token, table = mint_token("ci", days=1, now=NOW)
    entry = Tokens.parse(table).by_name["ci"]
    assert entry.expires == NOW + 86400  # NOW is a whole second
    assert "expires = 2027-01-" in table  # a TOML date-time, UTC
    clock = [NOW]
    access = Access(tokens=Tokens.parse(table), clock=lambda: clock[0])
    for t in (NOW, NOW + 86399.999):
        clock[0] = t
        assert access.authenticate(token) == Principal("token:ci")
    for t in (NOW + 86400, NOW + 86400.001, NOW + 10**6):
        clock[0] = t
        with pytest.raises(Unauthenticated, match=r"^token:ci expired$"):
            access.authenticate(token)


def test_expiry_written_by_hand_with_and_without_offset() -> None:
    token = "ci.s3cret"
    digest = hashlib.sha256(token.encode()).hexdigest()
    at = dt.datetime(2030, 1, 1, tzinfo=dt.UTC).timestamp()
    for expires in ["2030-01-01T00:00:00Z", "2030-01-01T00:00:00", "2030-01-01T01:00:00+01:00"]:
        tokens = Tokens.parse(f'[token.ci]\nsha256 = "{digest}"\nexpires = {expires}\n')
        assert tokens.by_name["ci"].expires == at  # a local date-time is taken as UTC
        assert tokens.authenticate(token, at - 1) == Principal("token:ci")
        with pytest.raises(Unauthenticated, match="expired"):
            tokens.authenticate(token, at)


def test_a_wrong_secret_is_reported_as_invalid_even_when_expired() -> None:
    token, table = mint_token("ci", days=-1, now=NOW)
    tokens = Tokens.parse(table)
    with pytest.raises(Unauthenticated, match="invalid token"):
        tokens.authenticate(token + "x", NOW)  # the secret is checked before the expiry
    with pytest.raises(Unauthenticated, match="expired"):
        tokens.authenticate(token, NOW)


def test_bearer_header() -> None:
    token, table = mint_token("ci")
    access = Access(tokens=Tokens.parse(table), clock=lambda: NOW)
    for header in [f"Bearer {token}", f"bearer {token}", f"BEARER {token}",
                   f"  Bearer   {token}  "]:  # fmt: skip
        assert access.bearer(header) == Principal("token:ci")
    assert access.bearer(None) is ANONYMOUS
    assert access.bearer(None, Principal("cert:alice")) == Principal("cert:alice")
    for header in ["Bearer", "Bearer ", "Bearer    ", f"Basic {token}", token, "", "Token x"]:
        with pytest.raises(Unauthenticated, match="must be 'Bearer <token>'"):
            access.bearer(header)
    with pytest.raises(Unauthenticated, match=r"claimed token:ci\)"):
        access.bearer(f"Bearer {token}x")


# --------------------------------------------------------------------------- certificates


def test_certificate_names() -> None:
    peercert = {
        "subject": ((("countryName", "NL"),), (("organizationName", "x"), ("commonName", "alice"))),
        "issuer": ((("commonName", "ca"),),),
    }
    assert certificate_name(peercert) == "alice"
    assert certificate_principal(peercert) == Principal("cert:alice")
    assert certificate_name({"subject": ((("countryName", "NL"),),)}) is None
    assert certificate_name({}) is None
    assert certificate_name(None) is None
    assert certificate_principal(None) is None


# --------------------------------------------------------------------------- properties

names = st.text(min_size=1, max_size=40)
client_streams = names.filter(lambda s: not s.startswith(RESERVED_PREFIX))


@given(principal=names, stream=client_streams)
def test_everything_and_nothing(principal: str, stream: str) -> None:
    everything = Acl.parse('[principal."*"]\nread = ["*"]\nwrite = ["*"]\n')
    nothing = Acl.parse("")
    who = Principal(principal)
    for action in ("read", "write"):
        assert everything.allows(who, action, stream)
        assert not nothing.allows(who, action, stream)
    read_only = Access(Acl.parse('[principal."*"]\nread = ["*"]\n'))
    assert read_only.may(who, "read", stream)
    assert not read_only.may(who, "write", stream)
    assert read_only.streams(who, [stream]) == [stream]


token_names = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters='"\\'), min_size=1
).filter(lambda s: not any(c.isspace() for c in s))


@given(name=token_names)
def test_mint_round_trip_for_any_allowed_name(name: str) -> None:
    token, table = mint_token(name)
    assert Tokens.parse(table).authenticate(token, NOW) == Principal(f"token:{name}")


@pytest.mark.parametrize("name", ["\x1b", "a\x00b", "del\x7f"], ids=["esc", "nul", "del"])
def test_mint_refuses_or_round_trips_control_characters(name: str) -> None:
    try:
        token, table = mint_token(name)
    except ValueError:
        return  # refusing the name is fine too
    assert Tokens.parse(table).authenticate(token, NOW) == Principal(f"token:{name}")


@given(principal=names, rest=st.text(max_size=20))
def test_a_star_never_reaches_the_hubs_own_streams(principal: str, rest: str) -> None:
    everything = Acl.parse('[principal."*"]\nread = ["*", "?*", "[_]*", "*.*"]\n')
    named = Acl.parse('[principal."*"]\nread = ["_tidewire.*"]\n')
    stream = RESERVED_PREFIX + rest
    assert not everything.allows(Principal(principal), "read", stream)
    assert named.allows(Principal(principal), "read", stream)
    assert Access(everything).streams(Principal(principal), [stream, "x"]) == ["x"]


# --------------------------------------------------------------------------- expiry and reload


def _access(*tables: str, clock: list[float]) -> Access:
    return Access(Acl.parse('[principal."token:*"]\nread = ["*"]\nwrite = ["*"]\n'),
                  Tokens.parse("\n".join(tables)), clock=lambda: clock[0])  # fmt: skip


def test_a_token_that_expires_while_in_use_is_refused_at_the_next_decision() -> None:
    token, table = mint_token("ci", days=1, now=NOW)
    clock = [NOW]
    access = _access(table, clock=clock)
    who = access.authenticate(token)
    assert who == Principal("token:ci")  # the remembered token is not part of equality
    assert hash(who) == hash(Principal("token:ci"))
    assert "sha256" not in repr(who)
    access.check(who, "read", "orders")
    assert access.may(who, "write", "orders")
    clock[0] = NOW + 86400  # the expiry instant: refused from here on
    for decide in (
        lambda: access.check(who, "read", "orders"),
        lambda: access.may(who, "write", "orders"),
        lambda: access.streams(who, ["orders"]),
        lambda: access.check_monitor(who),
    ):
        with pytest.raises(Unauthenticated, match=r"^token:ci: its token expired$"):
            decide()
    # anonymous and certificate principals carry no token: nothing to re-validate
    assert not access.may(ANONYMOUS, "read", "orders")
    assert not access.may(Principal("cert:x"), "read", "orders")


def test_a_revoked_token_is_refused_at_the_next_decision() -> None:
    ci, ci_table = mint_token("ci")
    etl, etl_table = mint_token("etl")
    clock = [NOW]
    access = _access(ci_table, etl_table, clock=clock)
    ci_who, etl_who = access.authenticate(ci), access.authenticate(etl)
    access.replace(access.acl, Tokens.parse(etl_table))  # ci removed from the file: a reload
    with pytest.raises(Unauthenticated, match=r"^token:ci: its token was revoked$"):
        access.check(ci_who, "read", "orders")
    with pytest.raises(Unauthenticated, match="invalid token"):
        access.authenticate(ci)
    access.check(etl_who, "read", "orders")  # the others carry on
    # a new token under the same name does not revive the old one
    _, new_table = mint_token("ci")
    access.replace(access.acl, Tokens.parse(new_table + etl_table))
    with pytest.raises(Unauthenticated, match="revoked"):
        access.may(ci_who, "read", "orders")


def test_a_reload_can_extend_or_shorten_an_expiry() -> None:
    _, table = mint_token("ci", days=1, now=NOW)
    digest = Tokens.parse(table).by_name["ci"].sha256.hex()
    clock = [NOW + 2 * 86400]
    access = _access(table, clock=clock)
    expired = Principal("token:ci", Tokens.parse(table).by_name["ci"])
    with pytest.raises(Unauthenticated, match="expired"):
        access.check(expired, "read", "orders")
    access.replace(access.acl, Tokens.parse(f'[token."ci"]\nsha256 = "{digest}"\n'))
    access.check(expired, "read", "orders")  # no expiry any more
    access.replace(access.acl, Tokens.parse(
        f'[token."ci"]\nsha256 = "{digest}"\nexpires = 2020-01-01T00:00:00Z\n'))  # fmt: skip
    with pytest.raises(Unauthenticated, match="expired"):
        access.check(expired, "read", "orders")


def test_a_reload_replaces_the_acl_for_open_connections() -> None:
    token, table = mint_token("ci")
    access = _access(table, clock=[NOW])
    who = access.authenticate(token)
    access.check(who, "write", "orders")
    access.replace(Acl.parse('[principal."token:ci"]\nread = ["orders"]\n'), access.tokens)
    access.check(who, "read", "orders")
    with pytest.raises(Forbidden):
        access.check(who, "write", "orders")
    access.replace(None, access.tokens)  # no ACL file any more: open
    assert access.open
    access.check(who, "write", "orders")


@pytest.mark.parametrize(
    ("presented", "shown"),
    [
        ("nobody.secret", "claimed token:nobody)"),
        ("ci.SECRETSECRET.oops", "not shown"),  # <name>.<secret> pasted with more after it
        ("x" * 65 + ".secret", "not shown"),
        ("x" * 64 + ".secret", "claimed token:" + "x" * 64 + ")"),
        ("nosecret", "a malformed token"),
    ],
)
def test_a_refusal_never_repeats_a_secret(presented: str, shown: str) -> None:
    _, table = mint_token("ci")
    with pytest.raises(Unauthenticated) as info:
        Tokens.parse(table).authenticate(presented, NOW)
    assert shown in str(info.value)
    assert "SECRETSECRET" not in str(info.value)
