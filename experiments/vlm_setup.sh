# Sourced by the VLM experiments after they read their arguments: checks that the model parts are
# in $models, builds kvsim in $build if it is missing, and sets k (the kvsim binary), py (Debian's
# Python) and PYTHONPATH (the built module). $name names the experiment in messages.
for part in mobilenet_v2/graph.json stories260K/config.json; do
  [ -f "$models/$part" ] || { echo "$name: no $models/$part (python3 -m kvsim.models fetch --models $models, or set KVSIM_MODELS)" >&2; exit 1; }
done
[ -x "$build/kvsim" ] || { cmake -S "$repo" -B "$build" -DCMAKE_BUILD_TYPE=Release && cmake --build "$build" -j"$(nproc)"; }
k="$build/kvsim"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
# The prompt tail an order feeds after compression, as `--prompt-tail` takes it (empty: none):
# compress and append compress the whole prompt; tail1 its last token, tailq its question after.
# Fails (status 1) on an order it does not know; the caller names the choices.
prompt_tail_of() {
  case $1 in
    compress | append) echo "" ;;
    tail1) echo 1 ;;
    tailq) echo question ;;
    *) return 1 ;;
  esac
}
