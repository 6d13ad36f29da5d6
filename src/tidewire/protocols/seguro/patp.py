"""Urbit ``@p`` names: the syllable tables and a strict check of the rendered forms.

A ``@p`` renders an unsigned number as syllables from two fixed tables of 256 (``++po`` in
Urbit's ``hoon.hoon``): a galaxy (< 2**8) is one suffix (``~zod``); a star (< 2**16) one prefix
and one suffix (``~marzod``); a planet (< 2**32) two such words (``~sampel-palnet``); a moon
(< 2**64) four; a comet (< 2**128) eight, with ``--`` between its two halves of four. This
module checks the *form* (which syllables, how many, joined how); it does not compute the
number (a point's name is what identifies its event stream here), so ``~doznec-dozzod`` style
leading-zero words are accepted exactly when Urbit would render them.

The tables are data from Urbit, not code.
"""

from __future__ import annotations

import re

from ...model import TidewireError

__all__ = ["PREFIXES", "SUFFIXES", "InvalidPatp", "rank", "validate_patp"]

_PREFIX_TEXT = (
    "dozmarbinwansamlitsighidfidlissogdirwacsabwissibrigsoldopmodfoglidhopdar"
    "dorlorhodfolrintogsilmirholpaslacrovlivdalsatlibtabhanticpidtorbolfosdot"
    "losdilforpilramtirwintadbicdifrocwidbisdasmidloprilnardapmolsanlocnovsit"
    "nidtipsicropwitnatpanminritpodmottamtolsavposnapnopsomfinfonbanmorworsip"
    "ronnorbotwicsocwatdolmagpicdavbidbaltimtasmalligsivtagpadsaldivdactansid"
    "fabtarmonranniswolmispallasdismaprabtobrollatlonnodnavfignomnibpagsopral"
    "bilhaddocridmocpacravripfaltodtiltinhapmicfanpattaclabmogsimsonpinlomric"
    "tapfirhasbosbatpochactidhavsaplindibhosdabbitbarracparloddosbortochilmac"
    "tomdigfilfasmithobharmighinradmashalraglagfadtopmophabnilnosmilfopfamdat"
    "noldinhatnacrisfotribhocnimlarfitwalrapsarnalmoslandondanladdovrivbacpol"
    "laptalpitnambonrostonfodponsovnocsorlavmatmipfip"
)
_SUFFIX_TEXT = (
    "zodnecbudwessevpersutletfulpensytdurwepserwylsunrypsyxdyrnuphebpeglupdep"
    "dysputlughecryttyvsydnexlunmeplutseppesdelsulpedtemledtulmetwenbynhexfeb"
    "pyldulhetmevruttylwydtepbesdexsefwycburderneppurrysrebdennutsubpetrulsyn"
    "regtydsupsemwynrecmegnetsecmulnymtevwebsummutnyxrextebfushepbenmuswyxsym"
    "selrucdecwexsyrwetdylmynmesdetbetbeltuxtugmyrpelsyptermebsetdutdegtexsur"
    "feltudnuxruxrenwytnubmedlytdusnebrumtynseglyxpunresredfunrevrefmectedrus"
    "bexlebduxrynnumpyxrygryxfeptyrtustyclegnemfermertenlusnussyltecmexpubrym"
    "tucfyllepdebbermughuttunbylsudpemdevlurdefbusbeprunmelpexdytbyttyplevmyl"
    "wedducfurfexnulluclennerlexrupnedlecrydlydfenwelnydhusrelrudneshesfetdes"
    "retdunlernyrsebhulrylludremlysfynwerrycsugnysnyllyndyndemluxfedsedbecmun"
    "lyrtesmudnytbyrsenwegfyrmurtelreptegpecnelnevfes"
)
PREFIXES: tuple[str, ...] = tuple(_PREFIX_TEXT[i : i + 3] for i in range(0, 768, 3))
SUFFIXES: tuple[str, ...] = tuple(_SUFFIX_TEXT[i : i + 3] for i in range(0, 768, 3))
_PRE = frozenset(PREFIXES)
_SUF = frozenset(SUFFIXES)

_W = "[a-z]{6}"
_SHAPE = re.compile(
    rf"~(?:[a-z]{{3}}|{_W}|{_W}-{_W}|{_W}(?:-{_W}){{3}}|{_W}(?:-{_W}){{3}}--{_W}(?:-{_W}){{3}})"
)


class InvalidPatp(TidewireError, ValueError):
    """Not a rendered ``@p``."""


def _word(word: str) -> bool:
    return word[:3] in _PRE and word[3:] in _SUF


def rank(patp: str) -> str:
    """``galaxy``, ``star``, ``planet``, ``moon`` or ``comet``; :class:`InvalidPatp` if it is
    not a ``@p`` (the ``~``, the syllables, and the grouping are all checked)."""
    if not _SHAPE.fullmatch(patp):
        raise InvalidPatp(f"{patp!r} is not an @p (like ~zod, ~marzod, ~sampel-palnet)")
    body = patp[1:]
    if len(body) == 3:
        if body not in _SUF:
            raise InvalidPatp(f"{patp!r}: {body!r} is not an @p suffix syllable")
        return "galaxy"
    words = body.replace("--", "-").split("-")
    bad = [w for w in words if not _word(w)]
    if bad:
        raise InvalidPatp(f"{patp!r}: {bad[0]!r} is not an @p prefix+suffix pair")
    # The number's top half is never zero (it would render shorter): a star's high byte, a
    # planet's high 16 bits (after Urbit's scrambling, which keeps planets >= 2**16), a moon's
    # high 32 bits, a comet's high 64 bits.
    top = {1: body[:3] == "doz", 2: words[0] == "dozzod", 4: words[:2] == ["dozzod"] * 2,
           8: words[:4] == ["dozzod"] * 4}[len(words)]  # fmt: skip
    if top:
        raise InvalidPatp(f"{patp!r} has a leading zero: Urbit renders that number shorter")
    return {1: "star", 2: "planet", 4: "moon", 8: "comet"}[len(words)]


def validate_patp(patp: str) -> str:
    """``patp`` if it is a rendered ``@p`` (see :func:`rank`), else :class:`InvalidPatp`."""
    rank(patp)
    return patp
