export const VERSION = "0.1.0"; // the package.json version (a test holds them equal)
