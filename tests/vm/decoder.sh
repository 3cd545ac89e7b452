# Causal decoders generating on the NPU with rbln-generate: GPT-2 and a
# Llama-style model as prefill and decode programs
# (tests/compiler/compile-exports.sh made them and transformers' greedy
# tokens on the host), the KV cache resident on the device.
. tests/vm/lib.sh
e=target/exports

check "the decoder programs were made on the host" test -f $e/llama-decode.rbln
check "insmod rbln.ko" insmod kmd/rbln.ko
for m in gpt2 llama; do
    prompt=$(cat $e/$m-decoder.prompt.txt)
    want=$(cat $e/$m-decoder.generated.txt)
    n=$(echo "$want" | tr ',' '\n' | wc -l)
    check "$m: rbln-generate greedy through the prefill" sh -c \
        "rbln-generate $e/$m-decode.rbln --prefill $e/$m-prefill.rbln --prompt-ids $prompt --max-new-tokens $n >/tmp/$m.tok"
    check "$m: the $n tokens are transformers' generate()'s" test "$(tr '\n' ',' </tmp/$m.tok | sed 's/,$//')" = "$want"
    check "$m: the prompt token by token through the decode program gives them too" sh -c \
        "rbln-generate $e/$m-decode.rbln --prompt-ids $prompt --max-new-tokens $n --json >/tmp/$m.json && grep -q '\"tokens\":\[$want\]' /tmp/$m.json && grep -q '\"prefill\":false' /tmp/$m.json"
done
rbln-generate $e/gpt2-decode.rbln --prefill $e/gpt2-prefill.rbln --prompt-ids "$(cat $e/gpt2-decoder.prompt.txt)" --max-new-tokens 32 --json
p=$(cat $e/gpt2-decoder.prompt.txt)
s="rbln-generate $e/gpt2-decode.rbln --prefill $e/gpt2-prefill.rbln --prompt-ids $p --max-new-tokens 24 --json"
toks() { grep -o '"tokens":\[[0-9,]*\]' "$1"; }
check "top-k sampling (seed 7)" sh -c "$s --sampling top-k --top-k 20 --temperature 1.5 --seed 7 >/tmp/a.json"
check "top-k sampling (seed 7 again)" sh -c "$s --sampling top-k --top-k 20 --temperature 1.5 --seed 7 >/tmp/b.json"
check "top-p sampling (seed 8)" sh -c "$s --sampling top-p --top-p 0.95 --temperature 1.5 --seed 8 >/tmp/c.json"
check "the same seed gives the same tokens" test "$(toks /tmp/a.json)" = "$(toks /tmp/b.json)"
check "another seed gives other tokens" test "$(toks /tmp/a.json)" != "$(toks /tmp/c.json)"
first=$(cut -d, -f1 $e/gpt2-decoder.generated.txt)
check "--eos-id stops after that token (the first greedy one here)" sh -c \
    "$s --eos-id $first | grep -q '\"tokens\":\[$first\],\"new_tokens\":1,'"
rc=0; rbln-generate $e/gpt2-decode.rbln --prompt-ids 1,2,3 --max-new-tokens 200 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "too many tokens for the cache: exit 2, says so" sh -c "test $rc = 2 && grep -q 'do not fit the cache of 80 positions' /tmp/err"
rc=0; rbln-generate $e/gpt2-prefill.rbln --prompt-ids 1,2,3 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "a program that is not a decode step: exit 2, names what is missing" sh -c "test $rc = 2 && grep -q \"needs inputs 'input_ids' and 'position'\" /tmp/err"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
