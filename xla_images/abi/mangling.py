"""Read the ABI a mangled C++ name uses, match a symbol with its twin under the other ABI, name what torch defines,
and demangle names for people.

How a symbol shows its ABI (Itanium mangling as GCC emits it):

* cxx11: the namespace ``std::__cxx11`` (``NSt7__cxx11...``) or the ``[abi:cxx11]`` tag (``B5cxx11``) that GCC
  adds to names whose return or variable type is a C++11 string/list.
* pre-cxx11: ``std::string`` spelt ``Ss``, ``std::basic_string`` spelt ``Sb``, or ``std::list`` and the
  string-stream classes directly under ``St`` (old ABI), e.g. undefined references to ``_ZNSs...``.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from typing import Iterable, Sequence

# Undefined symbols naming these namespaces are torch's own entities.
TORCH_NAMESPACES: tuple[str, ...] = ("torch", "c10", "at", "caffe2")


# Cheap pre-filters: most symbols match neither, and only old-ABI hints need the careful scan below because
# `Ss`/`Sb` also occur inside ordinary identifiers (`isSslEnabled`).
_OLD_ABI_HINT = re.compile(
    r"S[sb]|St(?:4list|10_List_base|12basic_string|15basic_stringbuf|18basic_stringstream|19basic_[io]stringstream)"
)
_NEW_ABI_HINT = re.compile(r"7__cxx11|B5cxx11")
# Classes the dual ABI duplicated: without `__cxx11` right under `std` they are the old ones.
_OLD_ABI_STD_CLASSES = frozenset({
    "list", "_List_base", "basic_string", "basic_stringbuf", "basic_stringstream", "basic_istringstream",
    "basic_ostringstream",
})
_SUBSTITUTION = re.compile(r"S[0-9A-Z]*_")
_DIGITS = re.compile(r"[0-9]+")
_MAX_LENGTH_DIGITS = 9  # an identifier of 10**9 characters or more is not a real symbol
_LAMBDA_END = re.compile(r"E[0-9]*_")
# Productions in which digits are NOT the length of a following identifier.
_NON_NAME = re.compile(r"""
      T_ | T[0-9]+_ | TL[0-9]*__[0-9]*_                  # template parameters
    | Thn?[0-9]+_ | Tvn?[0-9]+_n?[0-9]+_                 # thunk offsets
    | Tc(?:hn?[0-9]+_|vn?[0-9]+_n?[0-9]+_){2}
    | T[A-Za-z] | G[VRT]                                 # special names: TV TI TS TT ... guard variables
    | L_Z | L(?:[a-z]|D[a-zA-Z])n?[0-9a-fA-F.]*E          # literals: Li5E, Lb1E, external names
    | A[0-9]*_                                           # array bounds
    | _[0-9] | __[0-9]+_                                 # discriminators
    | CI?[1-5] | D[0-5]                                  # constructors, destructors
    | D[vFBU][0-9]+_?                                    # vectors, _FloatN, _BitInt
    | Ut[0-9]*_                                          # unnamed types
    | fp[rVK]*[0-9]*_ | fL[0-9]+p[rVK]*[0-9]*_           # function parameter references
""", re.VERBOSE)


def symbol_abi(name: str) -> tuple[bool, bool]:
    """(uses the C++11 ABI, uses the pre-C++11 ABI) for one symbol name; both False when it shows neither."""
    if not name.startswith("_Z"):
        return False, False
    if _OLD_ABI_HINT.search(name) is None:
        return _NEW_ABI_HINT.search(name) is not None, False
    return _scan_mangled(name)


def count_abi_symbols(names: Iterable[str]) -> tuple[int, int]:
    """(names using the C++11 ABI, names using the pre-C++11 ABI); a name showing both counts in both.

    Same rules as `symbol_abi`, but the pre-filters run once over all names joined by newlines (C speed) and
    only the lines they hit are looked at in Python: libraries have up to ~400k dynamic symbols.
    """
    text = "\n".join(names)
    new_lines = _hit_lines(_NEW_ABI_HINT, text)
    cxx11, pre_cxx11 = len(new_lines), 0
    for start, end in _hit_lines(_OLD_ABI_HINT, text).items():
        new, old = _scan_mangled(text[start:end])
        cxx11 += new - (start in new_lines)
        pre_cxx11 += old
    return cxx11, pre_cxx11


def _hit_lines(pattern: re.Pattern[str], text: str) -> dict[int, int]:
    """{start: end} of the lines of text that start with `_Z` and contain a match of pattern."""
    lines: dict[int, int] = {}
    next_line = 0  # matches come in order: skip the rest of a line already taken
    for match in pattern.finditer(text):
        if match.start() < next_line:
            continue
        start = text.rfind("\n", 0, match.start()) + 1
        end = text.find("\n", match.end())
        next_line = len(text) if end < 0 else end
        if text.startswith("_Z", start):
            lines[start] = next_line
    return lines


def _scan_mangled(name: str) -> tuple[bool, bool]:
    """Walk a mangled name token by token, skipping identifiers, and note the ABI markers it carries.

    Not a demangler: it only needs to know where identifiers start and end (`<length><chars>`) so that letters
    inside them are never read as grammar, and to recognise the std abbreviations and abi tags.
    """
    new = old = False
    position, end = 2, len(name)
    after_std = after_tag = False
    lambdas = 0
    while position < end:
        char = name[position]
        if char.isdigit():
            start = position
            while position < end and name[position].isdigit():
                position += 1
            # More digits than the name has characters cannot be a length (and int() refuses > 4300 digits).
            length = int(name[start:position]) if position - start <= _MAX_LENGTH_DIGITS else 0
            if 0 < length <= end - position:
                identifier = name[position:position + length]
                if identifier == "__cxx11" or (after_tag and identifier == "cxx11"):
                    new = True
                elif after_std and identifier in _OLD_ABI_STD_CLASSES:
                    old = True
                position += length
            after_std = after_tag = False
            continue
        next_after_std = next_after_tag = False
        following = name[position + 1] if position + 1 < end else ""
        if char == "S" and following in ("s", "b"):
            old = True
            position += 2
        elif char == "S" and following == "t":
            position += 2
            next_after_std = True
        elif char == "S" and following in ("a", "i", "o", "d"):
            position += 2
        elif char == "S":
            match = _SUBSTITUTION.match(name, position)
            position = match.end() if match else position + 1
        elif char == "B" and following.isdigit():
            position += 1
            next_after_tag = True
        elif char == "U" and following == "l":
            lambdas += 1
            position += 2
        elif char == "E" and lambdas and (match := _LAMBDA_END.match(name, position)):
            lambdas -= 1
            position = match.end()
        elif char == ".":
            break  # clone suffixes (.isra.0, .cold) carry no ABI
        else:
            match = _NON_NAME.match(name, position)
            position = match.end() if match else position + 1
        after_std, after_tag = next_after_std, next_after_tag
    return new, old


# The C++11 std::string spelt out; std::__cxx11 and the parts may be back-references to earlier mentions.
_CXX11_STRING = re.compile(
    r"N(?:St7__cxx11|S[0-9A-Z]*_)12basic_stringIc(?:St11char_traitsIcE|S[0-9A-Z]*_)(?:SaIcE|S[0-9A-Z]*_)EE"
)
# After rewriting, what differs between the two manglings is only back-reference numbering (the C++11 spelling
# adds substitution candidates) and whether char_traits/allocator were spelt or referenced, so all collapse.
_COLLAPSE = re.compile(r"SaIcE|St11char_traitsIcE|Ss|S[0-9A-Z]*_")


def abi_neutral_key(name: str) -> str:
    """A key equal for a symbol and its twin under the other ABI.

    Rewrites `NSt7__cxx1112basic_string<char...>` to `Ss` and a standalone `NSt7__cxx114listI..EE` to
    `St4listI..E`, drops other `__cxx11` namespaces and `[abi:cxx11]` tags, then collapses back-references.
    Lossy on purpose: it only serves to find, for a symbol that is missing, an exported symbol that differs
    from it by ABI, and `_TwinIndex.find` additionally requires their ABI markers to differ.
    """
    key = _CXX11_STRING.sub("Ss", name)
    key = _unnest_cxx11_classes(key)
    key = key.replace("7__cxx11", "").replace("B5cxx11", "")
    return _COLLAPSE.sub("S_", key)


_NESTED_CXX11_CLASS = re.compile(r"NSt7__cxx11([0-9]+)")
_TEMPLATE_OPENERS = frozenset("NIFXJ")
_LITERAL = re.compile(r"L(?:[a-z]|D[a-zA-Z])n?[0-9a-fA-F.]*E")


def _unnest_cxx11_classes(name: str) -> str:
    """`NSt7__cxx114listIiSaIiEEE` (std::__cxx11::list<int> as a whole type) -> `St4listIiSaIiEE`, the old
    spelling of std::list<int>; members (`NSt7__cxx114listIiSaIiEE5clearEv`) keep their N..E and only lose the
    namespace later, exactly as the old ABI spells them."""
    position = 0
    while (match := _NESTED_CXX11_CLASS.search(name, position)) is not None:
        after_name = match.end() + int(match.group(1))
        close = _skip_template_args(name, after_name) if name.startswith("I", after_name) else after_name
        if close is not None and name.startswith("E", close):
            name = f"{name[:match.start()]}St{name[match.start(1):close]}{name[close + 1:]}"
        position = match.start() + 1
    return name


def _skip_template_args(name: str, start: int) -> int | None:
    """Index just past the `E` closing the template arguments that open at name[start] == 'I'; None if lost."""
    depth, position = 0, start
    while position < len(name):
        char = name[position]
        if char.isdigit():
            digits = _DIGITS.match(name, position).group()
            if len(digits) > _MAX_LENGTH_DIGITS:
                return None
            position += len(digits) + int(digits)
            continue
        literal = _LITERAL.match(name, position) if char == "L" else None
        substitution = _SUBSTITUTION.match(name, position) if char == "S" else None
        if literal or substitution:
            position = (literal or substitution).end()
            continue
        if char in _TEMPLATE_OPENERS:
            depth += 1
        elif char == "E":
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    return None


# A nested name (after optional cv/ref qualifiers) whose first component is one of TORCH_NAMESPACES.
_TORCH_NAMESPACE = re.compile(r"N[rVKRO]*(?:" + "|".join(f"{len(name)}{name}" for name in TORCH_NAMESPACES) + ")")


TORCH_NAMESPACE_BYTES = re.compile(_TORCH_NAMESPACE.pattern.encode())


def names_torch_namespace(name: str) -> bool:
    """Does the mangled name mention torch::, c10::, at:: or caffe2:: (as itself or in its arguments)?"""
    return _TORCH_NAMESPACE.search(name) is not None


# The entity itself (not an argument) is in a torch namespace: `_ZNK3c1010TensorImpl...`, vtables `_ZTVN3c10...`,
# function-local statics `_ZZN2at...`, ref-qualified members `_ZNR5torch7Library...`.
_TORCH_ENTITY = re.compile(r"_Z(?:T[VTIS]|GV|GR|Thn?[0-9]+_|Tvn?[0-9]+_n?[0-9]+_)?Z?" + _TORCH_NAMESPACE.pattern)


def is_torch_entity(name: str) -> bool:
    """Is the symbol something torch defines? `torchaudio::sox::save_audio_file(at::Tensor, ...)` names at::
    in its arguments only: a sibling library of torchaudio defines it, and torch's absence of it says nothing."""
    return _TORCH_ENTITY.match(name) is not None


# References that register operators with torch's dispatcher (TORCH_LIBRARY / TORCH_LIBRARY_IMPL, RegisterOperators).
REGISTERS_OPERATORS = re.compile(r"_ZN[rVKRO]*(?:5torch7Library|3c1017RegisterOperators)")


DEMANGLE_TIMEOUT = 20.0
DEMANGLE_MAX_CHARS = 16384


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> readable with c++filt when installed; otherwise names stay mangled."""
    tool = shutil.which("c++filt")
    if not names or tool is None or any(len(name) > DEMANGLE_MAX_CHARS or "\n" in name for name in names):
        return {name: name for name in names}
    # c++filt has had crashes and exponential blow-ups on crafted names: bounded, and then names stay mangled.
    try:
        completed = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True,
                                   check=False, timeout=DEMANGLE_TIMEOUT)
    except (subprocess.TimeoutExpired, OSError):
        return {name: name for name in names}
    lines = completed.stdout.splitlines()
    if completed.returncode != 0 or len(lines) != len(names):
        return {name: name for name in names}
    return dict(zip(names, lines))

