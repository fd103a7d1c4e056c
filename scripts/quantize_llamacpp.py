#!/usr/bin/env python3
"""quantize_llamacpp.py: quantize a GGUF file with llama.cpp's own quantizer
(llama_model_quantize through llama-cpp-python) and compare its output with
kiln's, tensor by tensor: the type each tensor got and its bytes.

    python3 scripts/quantize_llamacpp.py IN.gguf KILN_OUT.gguf TYPE [--pure]

TYPE: q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k (llama.cpp's Q4_K_S, Q5_K_S,
Q6_K files), q4_k_s q5_k_s q4_k_m q5_k_m. Output (stdout): one line per tensor whose type or bytes differ
("TYPE name kiln=.. llama.cpp=.." or "BYTES name type offset"), then
"tensors N same_type S same_bytes B". Exit status: 0 ran (the caller judges
the counts), 1 llama.cpp failed, 2 usage, 3 llama_cpp is not installed.
"""
import os, sys, tempfile

FTYPES = {"q4_0": "Q4_0", "q4_1": "Q4_1", "q5_0": "Q5_0", "q5_1": "Q5_1", "q8_0": "Q8_0",
          "q4_k": "Q4_K_S", "q5_k": "Q5_K_S", "q6_k": "Q6_K", "q4_k_s": "Q4_K_S", "q5_k_s": "Q5_K_S",
          "q4_k_m": "Q4_K_M", "q5_k_m": "Q5_K_M"}


def main():
    args = [a for a in sys.argv[1:] if a != "--pure"]
    if len(args) != 3 or args[2].lower() not in FTYPES:
        sys.stderr.write("usage: quantize_llamacpp.py IN.gguf KILN_OUT.gguf q4_0|q4_1|q5_0|q5_1|q8_0|q4_k|q5_k|q6_k|q4_k_s|q5_k_s|q4_k_m|q5_k_m [--pure]\n")
        return 2
    try:
        import ctypes
        import llama_cpp
        import gguf
    except ImportError as e:
        sys.stderr.write("quantize_llamacpp.py: %s; pip install llama-cpp-python gguf\n" % e)
        return 3
    src, kiln_out, t = args[0], args[1], args[2].lower()
    quiet = llama_cpp.llama_log_callback(lambda level, text, user: None)
    llama_cpp.llama_log_set(quiet, ctypes.c_void_p(0))
    llama_cpp.llama_backend_init()
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + FTYPES[t])
    p.pure = "--pure" in sys.argv
    p.nthread = 1
    fd, ref = tempfile.mkstemp(suffix=".gguf")
    os.close(fd)
    try:
        rc = llama_cpp.llama_model_quantize(src.encode(), ref.encode(), ctypes.byref(p))
        if rc != 0:
            sys.stderr.write("quantize_llamacpp.py: llama_model_quantize failed (%d)\n" % rc)
            return 1
        a, b = gguf.GGUFReader(kiln_out), gguf.GGUFReader(ref)
        ta, tb = {x.name: x for x in a.tensors}, {x.name: x for x in b.tensors}
        same_t = same_b = 0
        for name, y in tb.items():
            x = ta.get(name)
            if x is None:
                print("MISSING %s" % name)
                continue
            if x.tensor_type != y.tensor_type:
                print("TYPE %s kiln=%s llama.cpp=%s" % (name, x.tensor_type.name, y.tensor_type.name))
                continue
            same_t += 1
            xb, yb = x.data.tobytes(), y.data.tobytes()
            if xb == yb:
                same_b += 1
            else:
                off = next(i for i in range(min(len(xb), len(yb))) if xb[i] != yb[i]) if len(xb) == len(yb) else -1
                print("BYTES %s %s %d" % (name, x.tensor_type.name, off))
        print("tensors %d same_type %d same_bytes %d" % (len(tb), same_t, same_b))
    finally:
        os.remove(ref)
    return 0


if __name__ == "__main__":
    sys.exit(main())
