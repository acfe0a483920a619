#!/usr/bin/env bash
# Run the settlement tick under leadership and branch on lead-exec's exit codes.
set -u
tick="$(date -u +%Y%m%dT%H%M)"
lead-exec run settlement --no-wait --run-key "$tick" -- /opt/settlement/bin/settle
code=$?
case $code in
  0)   echo "tick $tick: settled (or already settled by another worker)" ;;
  75)  echo "tick $tick: another worker leads; nothing to do" ;;
  76)  echo "tick $tick: leadership lost while running; the next leader continues" >&2 ;;
  79)  echo "tick $tick: this worker's health check fails; it did not take part" >&2 ;;
  64)  echo "tick $tick: bad lead-exec arguments" >&2; exit 2 ;;
  69)  echo "tick $tick: etcd unavailable; skipping this tick" >&2 ;;
  77)  echo "tick $tick: etcd refused our credentials" >&2; exit 2 ;;
  126|127) echo "tick $tick: settle is missing or not executable" >&2; exit 2 ;;
  *)   if [ "$code" -gt 128 ]; then
         echo "tick $tick: settle killed by signal $((code - 128))" >&2
       else
         echo "tick $tick: settle failed with exit code $code" >&2
       fi
       exit 1 ;;
esac
