// An agent in another language: two chat turns with Node's fetch, then its reward. It knows only what the
// trainer hands every agent: OPENAI_BASE_URL, OPENAI_API_KEY and ROLL_REWARD_URL.
const base = process.env.OPENAI_BASE_URL;
const headers = { "content-type": "application/json", authorization: `Bearer ${process.env.OPENAI_API_KEY}` };

async function chat(messages) {
  const body = JSON.stringify({ model: "policy", messages, max_tokens: 8, logprobs: true });
  const answer = await fetch(`${base}/chat/completions`, { method: "POST", headers, body });
  if (!answer.ok) throw new Error(`${answer.status} ${await answer.text()}`);
  return (await answer.json()).choices[0];
}

const messages = [{ role: "user", content: "Go." }];
const first = await chat(messages);
messages.push(first.message, { role: "user", content: "Again." });
const second = await chat(messages);
const reward = { reward: second.message.content.length % 2, metrics: { turns: 2 } };
const reported = await fetch(process.env.ROLL_REWARD_URL, { method: "POST", headers, body: JSON.stringify(reward) });
console.log(JSON.stringify({ logprobs: first.logprobs.content.map((t) => t.logprob), reward, status: reported.status }));
