// `npm run create-user -- <email> [environment]`: creates the user (and environment) if needed
// and prints a new API key for it. The key is shown once; only its hash is stored.
import { provisionApiKey } from "../src/auth/provision";
import { configureNeonForNode, nodeDb } from "./lib/neon-node";

const [email, environment = "default"] = process.argv.slice(2);
const url = process.env.DATABASE_URL;
if (!email || !/^[^@\s]+@[^@\s]+$/.test(email) || !url) {
  console.error("usage: DATABASE_URL=... npm run create-user -- <email> [environment]");
  process.exit(2);
}
configureNeonForNode(process.env.DATABASE_WS_PROXY || undefined);
const { db, pool } = nodeDb(url);
try {
  const made = await provisionApiKey(db, { email, environment, keyName: "create-user" });
  console.log(`user ${made.userId}, environment ${environment} (${made.environmentId})`);
  console.log(`API key (shown once): ${made.key}`);
} finally {
  await pool.end();
}
