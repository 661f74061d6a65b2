"""Go's ``fmt.Sprintf(format)`` with no arguments, for texts kube-scheduler formats.

kube-scheduler records a pod's FailedScheduling Event with
``Eventf(pod, nil, "Warning", "FailedScheduling", "Scheduling", msg)``, and the events
recorder builds the note with ``fmt.Sprintf(note, args...)``: the message (the counted
filter reasons, or an extender's ``Error``) is the *format*, with no arguments. This
module applies the verb-parsing rules of Go's ``fmt`` (``doPrintf`` in
``src/fmt/print.go``) to such a format, so tests can check that a text comes out as it
went in. Written from the documented behaviour, for the no-argument case only:

* text up to a ``%`` is copied;
* after ``%``: flags ``#0+- `` (any number), an argument index ``[n]`` (with no
  arguments every index is bad), a width (digits, or ``*``, which needs an argument:
  ``%!(BADWIDTH)``), a precision (``.`` then digits or ``*``: ``%!(BADPREC)``), another
  argument index, then one verb (a whole UTF-8 character);
* the verb ``%`` prints ``%`` whatever came before it (``%%``, ``% %``);
* any other verb, with no argument left, prints ``%!<verb>(MISSING)``, or
  ``%!<verb>(BADINDEX)`` after a bad index;
* a ``%`` with no verb before the end prints ``%!(NOVERB)`` and ends the format;
* digit runs are cut at 10^6 (``tooLarge``): the number is then not a number and the
  parse jumps to the end.
"""

from __future__ import annotations

FLAGS = "#0+- "
TOO_LARGE = 1_000_000


def _parsenum(s: str, start: int, end: int) -> tuple[int, bool, int]:
    """(number, whether digits were there, index after them); Go's ``parsenum``."""
    if start >= end:
        return 0, False, end
    num, isnum, i = 0, False, start
    while i < end and "0" <= s[i] <= "9":
        if num > TOO_LARGE or num < -TOO_LARGE:
            return 0, False, end
        num = num * 10 + ord(s[i]) - ord("0")
        isnum = True
        i += 1
    return num, isnum, i


def _arg_number(s: str, i: int) -> tuple[int, bool, bool]:
    """After ``[n]`` at ``i`` (or not): (next index, found an index, index good). With no
    arguments no index is good."""
    if i >= len(s) or s[i] != "[":
        return i, False, True
    if len(s) - i < 3:
        return i + 1, False, False
    for j in range(i + 1, len(s)):
        if s[j] == "]":
            _, ok, newi = _parsenum(s, i + 1, j)
            return j + 1, ok and newi == j, False
    return i + 1, False, False


def sprintf(fmt: str) -> str:
    """What Go's ``fmt.Sprintf(fmt)`` returns."""
    out: list[str] = []
    end, i = len(fmt), 0
    while i < end:
        j = fmt.find("%", i)
        if j < 0:
            out.append(fmt[i:])
            break
        out.append(fmt[i:j])
        i, good = _verb_prefix(fmt, j + 1, out)
        if i >= end:
            out.append("%!(NOVERB)")
            break
        verb = fmt[i]
        i += 1
        if verb == "%":
            out.append("%")
        else:
            out.append(f"%!{verb}({'BADINDEX' if not good else 'MISSING'})")
    return "".join(out)


def _verb_prefix(fmt: str, i: int, out: list[str]) -> tuple[int, bool]:
    """Flags, indexes, width and precision after a ``%``: (index of the verb, whether the
    argument index is good); what Go writes on the way (BADWIDTH, BADPREC) goes to ``out``."""
    end = len(fmt)
    while i < end and fmt[i] in FLAGS:
        i += 1
    good = True
    i, after_index, ok = _arg_number(fmt, i)
    good = good and ok
    if i < end and fmt[i] == "*":
        i += 1
        out.append("%!(BADWIDTH)")
        after_index = False
    else:
        _, present, i = _parsenum(fmt, i, end)
        if after_index and present:
            good = False
    if i + 1 < end and fmt[i] == ".":
        i += 1
        if after_index:
            good = False
        i, after_index, ok = _arg_number(fmt, i)
        good = good and ok
        if i < end and fmt[i] == "*":
            i += 1
            out.append("%!(BADPREC)")
            after_index = False
        else:
            _, _, i = _parsenum(fmt, i, end)
    if not after_index:
        i, after_index, ok = _arg_number(fmt, i)
        good = good and ok
    return i, good
