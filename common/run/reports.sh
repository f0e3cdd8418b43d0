#!/usr/bin/env bash
# `make reports`: `python -m common report` (its Python: $1) with Ctrl-C as one line and exit 130, and nothing from
# make or from Python's start-up. Python runs in a session of its own, so a signal reaches it only through this
# shell, once, and the shell holds a Ctrl-C until Python can take it:
#  * SIGINT belongs to whoever first creates the file $HANDS_ON_SIGINT_CLAIM (O_EXCL: one of the two can). Python
#    (common/__init__.py) tries first thing, once its handler is in place. A Ctrl-C before that -- Python's start-up,
#    where it would print a KeyboardInterrupt traceback -- is this shell's: it creates the file, and Python, finding
#    it there, stops with the [interrupted] line. A later Ctrl-C is passed on as SIGINT.
#  * SIGTERM and SIGHUP are passed on as they come (Python records its run as interrupted, exit 128 + signal).
#  * After Python's exit 130 this shell ends 0 and interrupts make (its parent) itself, which then stops with 130
#    without a word (for a recipe that failed it would add "make: *** [Makefile:NN: reports] Error 130").
# Only builtins run while the traps are set, and no subshell: a forked bash that a Ctrl-C reaches before it resets
# the parent's trap can loop on SIGINT for ever.
set -C                           # noclobber: `: > file` creates the file, or fails when it is there (O_EXCL)
claim="${TMPDIR:-/tmp}/hands-on-sigint-$$-$RANDOM$RANDOM"
pid= early=
pass_on() {          # $1: the signal
  if [ "$1" = INT ] && { : > "$claim"; } 2>/dev/null; then return; fi    # Python has not taken SIGINT over: ours
  if [ -z "$pid" ]; then early=$1; return; fi                            # Python not started yet
  kill -"$1" "$pid" 2>/dev/null
}
trap 'pass_on INT' INT
trap 'pass_on TERM' TERM
trap 'pass_on HUP' HUP
py="$1"; shift
own_session=
command -v setsid >/dev/null 2>&1 && own_session=setsid
HANDS_ON_SIGINT_CLAIM="$claim" $own_session "$py" -m common report "$@" &
pid=$!
[ -n "$early" ] && kill -"$early" "$pid" 2>/dev/null
while :; do           # a signal cuts `wait` short (status > 128): wait again while Python runs
  wait "$pid"; rc=$?
  if [ "$rc" -le 128 ] || ! kill -0 "$pid" 2>/dev/null; then break; fi
done
if [ "$rc" -gt 128 ]; then     # the last wait may have been cut short after Python ended: its own status, if kept
  wait "$pid" 2>/dev/null; last=$?
  if [ "$last" -ge 0 ] && [ "$last" -le 255 ] && [ "$last" -ne 127 ]; then rc=$last; fi
fi
trap '' INT TERM HUP             # Python is done: nothing more to pass on
rm -f "$claim"
parent=
read -r parent < "/proc/$PPID/comm" 2>/dev/null
if [ "$rc" -eq 130 ] && { [ "$parent" = make ] || [ "$parent" = gmake ]; }; then
  kill -INT "$PPID"
  exit 0
fi
exit "$rc"
