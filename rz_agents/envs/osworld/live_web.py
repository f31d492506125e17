"""OSWorld tasks whose instruction needs the live web, though no URL in their files says so.

``runnability`` finds web pages in a task's setup and getters; these tasks open no page in their
setup, yet ask the agent to read or fetch something online (a search, a named site, a download
named only in the instruction), which this offline desktop cannot reach: they would score 0
whatever the agent does. Read from the instructions of OSWorld's ``multi_apps`` test tasks
(``official/examples/multi_apps``); tasks solvable from the agent's own knowledge or the files
they come with are not listed (e.g. naming the mountains in photos, the conference cities of
2013-2019). Key: task id; value: what the instruction needs from the web.
"""

from __future__ import annotations

LIVE_WEB_TASKS: dict[str, str] = {
    "36037439-2044-4b50-b9d1-875b5a332143": "the corresponding author's Google Scholar page",
    "3c8f201a-009d-4bbe-8b65-a6f8b35bb57f": "an image downloaded from a Google Drive link in the instruction",
    "3eb2a122-a5e3-4f89-9820-f7fa1a582969": "an online search for ICLR 2035's deadline and venue",
    "48c46dc7-fe04-4505-ade7-723cba1aa6f6": "GitHub's home page and Python's online documentation in Chrome",
    "48d05431-6cd5-4e76-82eb-12b60d823f7d": "conda downloaded and installed (conda is not on the desktop)",
    "68a25bd4-59c7-4f4d-975e-da0c8509c848": "a paper's PDF downloaded and the papers citing it looked up",
    "69acbb55-d945-4927-a87b-8480e1a5bb7e": "a GitHub repository's environment installed from the web",
    "788b3701-3ec9-4b67-b679-418bfa726c22": "the next chapter downloaded from a GitHub repository",
    "7ff48d5b-2df2-49da-b500-a5150ffc7f18": "Shenzhen's self-service visa machine locations looked up online",
    "873cafdd-a581-47f6-8b33-b9696ddb7b05": "extensions installed from the Chrome Web Store",
    "a82b78bb-7fde-4cb3-94a4-035baf10bcf0": "the authors' personal web pages",
    "aad10cd7-9337-4b62-b704-a857848cedf2": "a page of developer.apple.com saved locally",
    "acb0f96b-e27c-44d8-b55f-7cb76609dfcd": "a GitHub repository cloned",
    "b337d106-053f-4d37-8da0-7f9c4043a66b": "an Internet search for a Vim tutorial",
    "c7c1e4c3-9e92-4eba-a4b8-689953975ea4": "the professors' home pages read for their e-mail addresses",
    "d1acdb87-bb67-4f30-84aa-990e56a09c92": "restaurants looked up on Google Maps",
    "da52d699-e8d2-4dc5-9191-a2199e0b6a9b": "howlongtoread.com as the reference",
    "deec51c9-3b1e-4b9e-993c-4776f20e8bb2": "arXiv daily's list of 11 Oct 2023",
    "e1fc0df3-c8b9-4ee7-864c-d0b590d3aa56": "LibreOffice's LanguageTool extension downloaded",
    "f8369178-fafe-40c2-adc4-b9b08a125456": "the Orchis theme downloaded from gnome-look.org",
}


# Tasks whose setup opens live pages that neither the agent's work nor the score depends on: offline
# the tabs show Chromium's "site can't be reached" page at that URL, and the task is scored on the
# desktop's files or the browser's own files (a bookmark keeps the URL the tab was sent to).
# Each was checked against OSWorld's getters and metrics and run on this desktop
# (tests/envs/osworld/test_osworld_offline_pages.py). Not here: tasks scored on the tabs' URLs (an
# error page's URL is chrome-error://chromewebdata/, to Playwright as to OSWorld's getter) or on a page.
# Key: task id; value: why the pages are not needed.
PAGES_NOT_NEEDED: dict[str, str] = {
    "7a5a7856-f1b6-42a4-ade9-1ca81ca0f263": "bookmark the page on screen: scored on the bookmark's URL",
    "e2392362-125e-4f76-a2ee-524b183a3412": "edit a local _config.yml (the page, a template's): scored on it",
    "3f05f3b9-29ba-4b6b-95aa-2204697ffc06": "tag local MP3s (pages: Picard's, Kid3's): scored on the files",
}
