# Causal decoders generating on the NPU: GPT-2 and a Llama-style model,
# each one .rbln whose six entry points (a decode step, prefills at 4 and
# 8 tokens, a batched decode step and slot prefills for continuous
# batching) share one copy of the weights and a KV cache resident on the
# device (tests/compiler/compile-exports.sh made them and transformers'
# greedy tokens on the host).
. tests/vm/lib.sh
e=target/exports

check "the decoders were made on the host" test -f $e/llama-decoder.rbln
check "insmod rbln.ko" insmod "$RBLN_KO"
rbln-run --inspect $e/gpt2-decoder.rbln | head -n 3
json=$(rbln-run --inspect --json $e/gpt2-decoder.rbln)
num() { echo "$json" | grep -o "\"$1\":[0-9]*" | head -n 1 | cut -d: -f2; }
w=$(num weight_bytes); sep=$(num weights_separate_bytes)
check "--inspect: six entry points share $w weight bytes (one file each would hold $sep)" \
    sh -c "test $(echo "$json" | grep -o '"weights_used_bytes"' | wc -l) = 6 && test $sep -gt $((5 * w))"
check "--inspect names the entries and the sharing" sh -c \
    "rbln-run --inspect $e/gpt2-decoder.rbln | grep -q 'entries:  decode, prefill_4, prefill_8, decode_batch, prefill_slot_4, prefill_slot_8' && rbln-run --inspect $e/gpt2-decoder.rbln | grep -q 'stored once, shared by 6 entry points'"
toks() { grep -o '"tokens":\[[0-9,]*\]' "$1" | sed 's/"tokens":\[//; s/\]//'; }
for m in gpt2 llama; do
    p1=$(cat $e/$m-decoder.prompt.txt); w1=$(cat $e/$m-decoder.generated.txt)
    p2=$(cat $e/$m-decoder.prompt2.txt); w2=$(cat $e/$m-decoder.generated2.txt)
    n1=$(echo "$w1" | tr ',' '\n' | wc -l); n2=$(echo "$w2" | tr ',' '\n' | wc -l)
    g="rbln-generate $e/$m-decoder.rbln"
    $g --prompt-ids $p1 --max-new-tokens $n1 --json >/tmp/a.json
    check "$m: greedy, the 8-token prompt through prefill_8: transformers' $n1 tokens" \
        sh -c "test '$(toks /tmp/a.json)' = $w1 && grep -q '\"prefill_tokens\":8' /tmp/a.json"
    $g --prompt-ids $p2 --max-new-tokens $n2 --json >/tmp/b.json
    check "$m: the 11-token prompt (prefill_8, then 3 decode steps): transformers' $n2 tokens" \
        sh -c "test '$(toks /tmp/b.json)' = $w2 && grep -q '\"prefill_tokens\":8' /tmp/b.json"
    $g --prompt-ids $p1 --max-new-tokens $n1 --no-prefill --json >/tmp/c.json
    check "$m: the prompt token by token through the decode step (--no-prefill): the same tokens" \
        sh -c "test '$(toks /tmp/c.json)' = $w1 && grep -q '\"prefill_tokens\":0' /tmp/c.json"
    $g --prompt-ids $p2 --max-new-tokens $n2 >/tmp/d.tok
    check "$m: streamed one token per line" test "$(tr '\n' ',' </tmp/d.tok | sed 's/,$//')" = "$w2"
    # Continuous batching: six sequences through four slots; the last two
    # join as others leave (the 10- and 5-token ones leave early).
    check "$m: continuous batching, 6 sequences over 4 slots" sh -c \
        "$g --prompt-ids $p1 --prompt-ids $p2 --prompt-ids $p1 --prompt-ids $p2 --prompt-ids $p2 --prompt-ids $p1 --max-new-tokens $n1,$n2,10,$n2,5,$n1 --json >/tmp/e.json"
    cut -c1-200 /tmp/e.json
    check "$m: every batched sequence got the tokens it gets alone" test "$(grep -o '"sequences":\[.*\]\],' /tmp/e.json)" = \
        "\"sequences\":[[$w1],[$w2],[$(echo $w1 | cut -d, -f1-10)],[$w2],[$(echo $w2 | cut -d, -f1-5)],[$w1]],"
    check "$m: all four slots were in use at once" grep -q '"most_active":4' /tmp/e.json
    short=$(echo $p1 | cut -d, -f1-3)
    $g --prompt-ids $short --max-new-tokens 12 --json >/tmp/f.json
    $g --batch --prompt-ids $short --max-new-tokens 12 --json >/tmp/g.json
    check "$m: a 3-token prompt (shorter than every prefill) alone and in the batch, all through decode steps" sh -c \
        "grep -q '\"prefill_tokens\":0' /tmp/f.json && grep -q '\"sequences\":\[\[$(toks /tmp/f.json)\]\]' /tmp/g.json"
done
p=$(cat $e/gpt2-decoder.prompt.txt)
s="rbln-generate $e/gpt2-decoder.rbln --prompt-ids $p --max-new-tokens 24 --json"
check "top-k sampling (seed 7)" sh -c "$s --sampling top-k --top-k 20 --temperature 1.5 --seed 7 >/tmp/a.json"
check "top-k sampling (seed 7 again)" sh -c "$s --sampling top-k --top-k 20 --temperature 1.5 --seed 7 >/tmp/b.json"
check "top-p sampling (seed 8)" sh -c "$s --sampling top-p --top-p 0.95 --temperature 1.5 --seed 8 >/tmp/c.json"
check "the same seed gives the same tokens" test "$(toks /tmp/a.json)" = "$(toks /tmp/b.json)"
check "another seed gives other tokens" test "$(toks /tmp/a.json)" != "$(toks /tmp/c.json)"
first=$(cut -d, -f1 $e/gpt2-decoder.generated.txt)
check "--eos-id stops after that token (the first greedy one here)" sh -c \
    "$s --eos-id $first | grep -q '\"tokens\":\[$first\],\"new_tokens\":1,'"
rc=0; rbln-generate $e/gpt2-decoder.rbln --prompt-ids 1,2,3 --max-new-tokens 200 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "too many tokens for the cache: exit 2, says so" sh -c "test $rc = 2 && grep -q 'do not fit the cache of 80 positions' /tmp/err"
rc=0; rbln-generate $e/gpt2-decoder.rbln --prompt-ids 1,2,3 --prompt-ids 4,5000 --max-new-tokens 4 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "a prompt token outside the vocabulary: exit 2, names it" sh -c "test $rc = 2 && grep -q 'prompt 1: prompt token 1 is 5000, outside the model' /tmp/err"
other=$(ls $e/*.rbln | grep -v decoder | head -n 1)
rc=0; rbln-generate $other --prompt-ids 1,2,3 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "a model without a decode step: exit 2, names what is missing" sh -c "test $rc = 2 && grep -q 'no entry point of the model is a decode step' /tmp/err"
rc=0; rbln-generate $e/gpt2-decoder.rbln --prompt-ids 1,2 --prompt-ids 3 --max-new-tokens 4,5,6 >/tmp/err 2>&1 || rc=$?
check "--max-new-tokens neither one value nor one per prompt: exit 2" sh -c "test $rc = 2 && grep -q '3 values for 2 prompts' /tmp/err"
rc=0; rbln-run $e/gpt2-decoder.rbln --entry prefill_5 >/tmp/err 2>&1 || rc=$?
cat /tmp/err
check "rbln-run --entry of an entry the model lacks: exit 2, lists the entries" sh -c "test $rc = 2 && grep -q \"no entry point 'prefill_5' (it has: decode, prefill_4\" /tmp/err"
check "rbln-run --entry prefill_4 runs that program" sh -c "rbln-run $e/gpt2-decoder.rbln --entry prefill_4 --json | grep -q '\"outputs\"'"
check "every resource came back" sh -c "grep -q '^contexts_open: 0' /sys/kernel/debug/rbln0/state && grep -q '^bos: 0' /sys/kernel/debug/rbln0/state"
check "rmmod rbln" rmmod rbln
