"""Drive a policy exported by `echo-rl export --format onnx` on MiniGrid with no echo_rl installed.

usage: python standalone_policy.py policy.onnx [episodes] [seed] [num_envs] [greedy|sample]  (numpy, onnxruntime,
minigrid). Episodes are the ones `echo-rl eval` runs (env i reset with seed + 10000*i, then its quota in a row).
greedy (default) equals echo_rl.load_policy(...)'s greedy evaluation exactly; sample draws from the policy as the
run's own evaluation does (numpy's RNG, not torch's: the same distribution, other draws).
"""
import json, re, sys
import gymnasium as gym, minigrid, numpy as np, onnxruntime as ort  # noqa: F401 (minigrid registers its envs)

path, *rest = sys.argv[1:] or sys.exit(__doc__)
sample, rest = rest[-1:] == ["sample"], [a for a in rest if a not in ("greedy", "sample")]
episodes, seed, num_envs = (int(a) for a in rest + ["100", "1000000", "16"][len(rest):])
rng = np.random.default_rng(seed)
sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
meta = json.loads(sess.get_modelmeta().custom_metadata_map["echo_rl"])
enc, k, width = meta["obs_encoding"], meta["window"], max(meta["window"], 1)
vocab = {w: i for i, w in enumerate(enc["mission_vocab"])}

def encode(o):  # image indices, direction, bag of mission words: the layout the policy was trained on
    bag = np.zeros(enc["mission_other_slot"] + 1, np.uint8)
    for w in re.findall(r"[a-z]+", o["mission"].lower()):
        bag[vocab.get(w, enc["mission_other_slot"])] = 1
    return np.concatenate([o["image"].reshape(-1), [o["direction"]], bag]).astype(np.uint8)[None]

env, results = gym.make(enc["env_id"], **enc["env_config"]), []
for i in range(num_envs := min(num_envs, episodes)):
    obs, _ = env.reset(seed=seed + 10_000 * i)
    for _ in range(episodes // num_envs + (i < episodes % num_envs)):
        window, mask = np.zeros((1, width, meta["obs_dim"]), np.uint8), np.zeros((1, width), bool)
        ret, done = 0.0, False
        while not done:
            x = encode(obs)
            window, mask = np.roll(window, -1, 1), np.roll(mask, -1, 1)  # plan inputs (EchoRL agent only)
            window[0, -1], mask[0, -1] = x, True
            feeds = {"obs": x, **({"window": window, "mask": mask} if k else {})}
            logits = sess.run(["logits"], feeds)[0][0]
            p = np.exp(logits - logits.max())
            obs, r, term, trunc, _ = env.step(int(rng.choice(len(p), p=p / p.sum()) if sample else logits.argmax()))
            ret, done = ret + r, term or trunc
        results.append((term and r > 0, ret))
        obs, _ = env.reset()
success, returns = zip(*results)
print(json.dumps({"success_rate": float(np.mean(success)), "avg_reward": float(np.mean(returns)),
                  "episodes": len(results)}))
