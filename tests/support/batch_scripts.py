"""Small command scripts the batch and drive tests write into their workspaces."""

#: invoke ITEM KEY OUT: keeps the arguments exactly as received in OUT/KEY.args, each ended by a NUL
#: byte; observe KEY OUT: present when kept. A shell script: the batch tests call it some fifty times.
RECORDER = r'''#!/bin/sh
if [ "$1" = invoke ]; then
    printf '%s\0' "$@" > "$4/$3.args" || exit 3
    printf '{"recorded": "%s"}\n' "$3"
    exit 0
fi
[ -e "$3/$2.args" ] || exit 1
printf '{"seen": "%s"}\n' "$2"
'''
