# Sourced by the real-model experiments: models_dir prints the models folder they read by
# default, as `python -m kvsim.models` chooses it: $KVSIM_MODELS; else the checkout's models/
# (where `python3 -m kvsim.models fetch` puts the models), or a shared/models folder beside the
# checkout where models/ is absent and that one exists. Needs $repo.
models_dir() {
  if [ -n "${KVSIM_MODELS:-}" ]; then echo "$KVSIM_MODELS"
  elif [ ! -d "$repo/models" ] && [ -d "$repo/../shared/models" ]; then
    echo "$repo/../shared/models"
  else echo "$repo/models"
  fi
}
