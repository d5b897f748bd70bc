# Runs examples/train_and_serve.py with a tiny model for STEPS steps; fails unless it exits 0,
# prints one "bit-exact" check per step and the final "bit-exact: yes" line.
execute_process(
  COMMAND ${PYTHON} ${SCRIPT} --steps ${STEPS} --dim 64 --layers 2 --heads 4 --kv-heads 2
          --hidden 128 --seq 32 --batch 2 --gen-tokens 8
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "train_and_serve.py exited with ${rc}")
endif()
string(REGEX MATCHALL "[0-9] +bit-exact  " checks "${out}")
list(LENGTH checks count)
if(NOT count EQUAL STEPS OR NOT out MATCHES "\nbit-exact: yes, every step\n")
  message(FATAL_ERROR "expected ${STEPS} bit-exact steps and the final line, got ${count}")
endif()
