"""Model zoo: registry (data), downloader and cache. Arrives with the zoo issue."""
