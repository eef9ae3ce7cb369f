# Sourced by the GPU scripts that run a list of commands in one device call: the tree on the
# path, unbuffered output, the GPU and library versions, and step LIMIT COMMAND…, which prints
# the command, runs it under `timeout LIMIT` and prints its exit code and seconds.
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
step() {  # a limit in seconds, then the command
  local limit=$1; shift
  echo "=== $*"
  local t0=$SECONDS
  timeout "$limit" "$@"
  echo "=== exit $? in $((SECONDS - t0)) s"
}
