// Validate an AsyncAPI document with the official parser (@asyncapi/parser).
// usage: node validate.cjs FILE   (NODE_PATH: the node_modules install.sh prints)
// Prints every diagnostic as one JSON line; exits 1 when the parser finds the
// document invalid (an error diagnostic), 0 otherwise.
const fs = require('fs');
const { Parser } = require('@asyncapi/parser');

(async () => {
  const text = fs.readFileSync(process.argv[2], 'utf8');
  const { document, diagnostics } = await new Parser().parse(text);
  for (const d of diagnostics) {
    console.log(JSON.stringify({ severity: d.severity, code: d.code, message: d.message, path: d.path }));
  }
  process.exit(document ? 0 : 1);
})().catch((err) => {
  console.error(err);
  process.exit(2);
});
