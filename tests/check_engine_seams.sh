#!/bin/sh
# Issue 12's include rules, checked on the sources (no build needed):
#  - forward.c, moe_layer.c, mtp.c, mtp_spec.c and backend.h never reach (transitively, through quoted
#    includes) a header of a backend folder (engine/cpu/, engine/cuda/);
#  - ep/ includes no engine header.
# Usage: check_engine_seams.sh SOURCE_DIR
src=${1:?source dir}
fail=0
resolve() { # $1 = including file, $2 = quoted name -> path or nothing
    d=$(dirname "$1")
    for base in "$d" "$src/engine" "$src/engine/include" "$src/common/include" "$src/ep/include"; do
        if [ -f "$base/$2" ]; then echo "$base/$2"; return; fi
    done
}
closure() { # files reachable from $1
    todo="$1"; seen=""
    while [ -n "$todo" ]; do
        set -- $todo; f=$1; shift; todo="$*"
        case " $seen " in *" $f "*) continue ;; esac
        seen="$seen $f"
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
            r=$(resolve "$f" "$inc")
            [ -n "$r" ] && todo="$todo $r"
        done
    done
    echo "$seen"
}
for f in forward.c moe_layer.c mtp.c mtp_spec.c backend.h; do
    for r in $(closure "$src/engine/$f"); do
        case "$r" in
        "$src"/engine/cpu/* | "$src"/engine/cuda/*)
            echo "engine/$f reaches backend header ${r#$src/}"; fail=1 ;;
        esac
    done
done
for f in "$src"/ep/*.c "$src"/ep/*.h "$src"/ep/include/moeq/*.h; do
    [ -f "$f" ] || continue
    for r in $(closure "$f"); do
        case "$r" in "$src"/engine/*) echo "${f#$src/} reaches engine header ${r#$src/}"; fail=1 ;; esac
    done
done
[ $fail = 0 ] && echo "engine seams: forward/moe_layer/mtp/backend.h reach no backend header; ep/ no engine header"
exit $fail
