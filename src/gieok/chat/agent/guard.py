"""Prompt-injection and jailbreak detection for incoming chat messages.

Weighted patterns with word boundaries, not substring matches (a substring test flags "dance"
as the "DAN" jailbreak). Text is normalised first (NFKC, case-folded,
leetspeak digits mapped, letters spaced out one by one re-joined, Korean compared without
spaces so "이 전 지 시 무 시" still reads 이전지시무시). Each matching pattern contributes
its weight w; the score is 1 − Π(1 − w), and a message is an attack at `threshold` (0.7).
Weak signals (a lone "system prompt", "developer mode") stay below it on their own.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

__all__ = ["InjectionGuard", "GuardVerdict", "normalise"]

_LEET = str.maketrans({"0": "o", "1": "i", "3": "e", "4": "a", "5": "s", "7": "t", "@": "a", "$": "s"})
_SPACED = re.compile(r"\b(?:\w[ .\-_*]){3,}\w\b")
_HANGUL = re.compile(r"[\uac00-\ud7a3]")


def _join_spaced(match: re.Match[str]) -> str:
    return re.sub(r"[ .\-_*]", "", match.group(0))


def normalise(text: str) -> tuple[str, str]:
    """(latin form, compact form): case-folded with leetspeak undone and spaced-out letters
    re-joined; the compact form also drops all whitespace, for Korean patterns."""
    text = unicodedata.normalize("NFKC", text).casefold()
    latin = _SPACED.sub(_join_spaced, text)
    latin = re.sub(r"(?<=[a-z])[013457@$](?=[a-z])|(?<=\b)[0134@$](?=[a-z]{2})",
                   lambda m: m.group(0).translate(_LEET), latin)
    compact = re.sub(r"\s+", "", latin)
    return latin, compact


@dataclass(frozen=True)
class _Pattern:
    name: str
    regex: re.Pattern[str]
    weight: float
    compact: bool = False  # match against the whitespace-free form (Korean)
    # A match does not count when this is found in its clause before it: the words are then
    # said of someone else ("why does my model ignore the system prompt"), not an order.
    veto: re.Pattern[str] | None = None
    # Substrings the pattern cannot match without, one of which must be present: a cheap test
    # that spares running the regex on most messages.
    needs: tuple[str, ...] = ()

    def fires(self, text: str) -> bool:
        for word in self.needs:
            if word in text:
                break
        else:
            if self.needs:
                return False
        if self.veto is None:
            return self.regex.search(text) is not None
        veto = self.veto
        return any(not veto.search(_clause_before(text, match.start())) for match in self.regex.finditer(text))


_CLAUSE_END = re.compile(r"[.!?;\n]")


def _clause_before(text: str, end: int) -> str:
    """The text from the start of the clause holding position `end` up to it."""
    start = max((m.end() for m in _CLAUSE_END.finditer(text, 0, end)), default=0)
    return text[start:end]


def _en(name: str, pattern: str, weight: float, veto: str | None = None, needs: tuple[str, ...] = ()) -> _Pattern:
    flags = re.IGNORECASE | re.DOTALL
    return _Pattern(name, re.compile(pattern, flags), weight, veto=re.compile(veto, flags) if veto else None,
                    needs=needs)


def _ko(name: str, pattern: str, weight: float, needs: tuple[str, ...] = ()) -> _Pattern:
    # NFKC, like the text: compatibility jamo (ㅍㄹㅍㅌ) become conjoining jamo
    return _Pattern(name, re.compile(unicodedata.normalize("NFKC", pattern), re.DOTALL), weight, compact=True,
                    needs=tuple(unicodedata.normalize("NFKC", word) for word in needs))


_VERBS_IGNORE = r"(?:ignore|disregard|forget|override|bypass|skip|drop|abandon)"
_INSTRUCTIONS = r"(?:instructions?|rules?|prompts?|guidelines?|directions?|directives?|programming|restrictions?|policies|policy)"

# Said of someone else rather than asked of the bot: a question about why something ignores its
# instructions ("why does my llama ignore the system prompt", "models tend to…") unless "you"
# follows, or a third-party subject right before the verb ("the model ignores…", "they ignore…").
_THIRD_PARTY = (r"\b(?:why (?:does|do|did|would|is|are)|(?:does|did|do|would) (?:my|the|our|this|that|it|its|his|her|their)"
                r"|seems? to|tends? to|keeps?)\b(?![^.!?\n]*\byou\b)"
                r"|(?:\b(?:my|the|our|this|that|his|her|their)\s+(?:\w+\s+)?(?:models?|llms?|llama|gpt|chatgpt|bots?|ai|assistant)"
                r"|\b(?:it|they|he|she|people))(?:\s+(?:just|always|often|sometimes|usually|still|never))?\s+$")

PATTERNS: tuple[_Pattern, ...] = (
    # English
    _en("ignore-instructions", rf"\b{_VERBS_IGNORE}\b[^.!?\n]{{0,40}}\b(?:previous|prior|above|earlier|all|any|your|ur|these|those|initial|original|system)\b[^.!?\n]{{0,25}}\b{_INSTRUCTIONS}\b", 0.9,
        veto=_THIRD_PARTY),
    _en("reveal-prompt", r"\b(?:reveal|show|print|repeat|tell|output|leak|dump|display|give|share|paste|recite)\b[^.!?\n]{0,40}(?<!\ban )(?<!\ba )(?<!example )(?<!sample )\b(?:system|hidden|initial|secret|original|internal|developer|full)\s+(?:prompt|instructions?|rules?|message|configuration|guidelines?)\b", 0.9, needs=('prompt', 'instruction', 'rule', 'message', 'configuration', 'guideline')),
    _en("prompt-verbatim", r"\b(?:system\s+prompt|your\s+instructions|your\s+rules)\b[^.!?\n]{0,30}\b(?:verbatim|word for word|exactly|in full|above)\b", 0.8),
    _en("system-prompt-mention", r"\bsystem\s+prompt\b", 0.3),
    _en("persona-override", r"\b(?:you are|you're|act as|pretend (?:to be|you are)|from now on,? you(?: are|'re| will be)?|become|roleplay as|role-play as)\b[^.!?\n]{0,40}\b(?:dan|unfiltered|uncensored|jailbroken|unrestricted|evil|amoral|without (?:any )?(?:rules|limits|restrictions|filters?|guidelines|ethics)|no (?:rules|limits|restrictions|filters?|guidelines|ethics))\b", 0.9),
    _en("do-anything-now", r"\bdo anything now\b", 0.9),
    _Pattern("dan-token", re.compile(r"\bDAN\b"), 0.3),  # case-sensitive: not "Dan", not "dance"
    _en("special-mode", r"\b(?:developer|god|admin|debug|jailbreak|unrestricted|sudo)\s+mode\b", 0.35, needs=('mode',)),
    _en("enable-mode", r"\b(?:enable|activate|enter|switch to|turn on|you are (?:now )?in|now in)\b[^.!?\n]{0,20}\b(?:developer|god|admin|debug|jailbreak|unrestricted|sudo)\s+mode\b", 0.5, needs=('mode',)),
    _en("no-rules", r"\b(?:no|without|zero|free of|free from)\s+(?:any\s+)?(?:rules|restrictions|limits|filters|guidelines|censorship|ethics|moral(?:s|ity)?)\b", 0.45),
    _en("from-now-on", r"\bfrom now on\b", 0.25),
    _en("fake-tag", r"(?:\[|<|\{|\(|#{1,3}\s*)\s*/?\s*(?:system|sys|admin|assistant|developer|instruction|im_start|im_end)\s*(?:\]|>|\}|\)|:)", 0.75),
    _en("fake-role-line", r"(?:^|\n)\s*(?:system|admin|developer|operator)\s*(?:message|override|notice)?\s*:", 0.7),
    _en("code-fence-system", r"```\s*(?:system|sys|admin|instructions?)\b", 0.8),
    _en("new-policy", r"\bnew\s+(?:rules?|policy|policies|instructions?|directives?|system\s+message)\b", 0.4),
    _en("remember-as-rule", r"\b(?:remember|store|save|memorize|record)\b[^.!?\n]{0,50}\b(?:permanently|forever|as a (?:rule|fact|permanent)|as your (?:rule|core)|in your (?:core|permanent))\b", 0.6),
    _en("you-are-allowed", r"\byou\s+(?:can|may|are allowed to|are permitted to|must)\s+(?:now\s+)?(?:swear|curse|ignore|break|say anything|do anything|bypass)\b", 0.5),
    _en("exfiltrate", r"\b(?:show|give|dump|list|tell|send|reveal|leak|share|export)\b[^.!?\n]{0,30}\b(?:other users?'?s?|everyone'?s|all users?'?s?|other people'?s|another user'?s)\b[^.!?\n]{0,20}\b(?:memor(?:y|ies)|data|messages|facts|dms?|conversations?|history|info(?:rmation)?)\b", 0.85),
    # A game without rules is an attack when the rules are the reader's or the reader is to answer in
    # it ("…where you break your rules", "…answer as that version"), not a board game's house rules
    # ("in this game you lose if you break the rules twice", "what if AIs had no rules — what do you think?").
    _en("game-ignore", r"\A(?=[\s\S]*\b(?:your|ur|answer|respond|reply|speak|stay in character|from now on)\b)[\s\S]*?"
        r"\b(?:game|pretend|hypothetical(?:ly)?|imagine)\b[^.!?\n]{0,60}\b(?:ignore|no|without|forget|break)\b[^.!?\n]{0,20}"
        r"\b(?:rules|guidelines|restrictions|instructions|filters?)\b", 0.75),
    _en("jailbreak-word", r"\bjailbr(?:eak|oken)\b", 0.4),
    # Not someone else's rules named as such: "the instructions for the build are outdated", "the
    # restrictions on my account are lifted" (but "the rules of this chat no longer apply" is).
    _en("rules-void", r"\b(?:rules?|instructions?|guidelines?|restrictions?|programming)\b"
        r"(?!\s+(?:for|on|of|in)\s+(?:my|our|his|her|their|the|this|that)\s+(?!(?:bot|ai|assistant|chat|conversation|session|server|channel)\b))"
        r"[^.!?\n]{0,50}\b(?:no longer apply|don'?t apply|do not apply|(?:are|is) (?:now )?(?:outdated|void|cancelled|canceled|suspended|lifted|gone|obsolete|just suggestions))\b", 0.85),
    _en("stop-following", r"\b(?:stop|quit|don'?t|do not|no need to)\s+(?:following|follow|obeying|obey|listening to|caring about)\b[^.!?\n]{0,30}\b(?:rules?|instructions?|guidelines?|restrictions?|devs?|developers?|creators?|filters?)\b", 0.85),
    _en("ignore-authors", r"\b(?:ignore|disregard|forget)\b[^.!?\n]{0,30}\b(?:devs?|developers?|creators?|owners?|admins?|operators?)\b[^.!?\n]{0,20}\b(?:told|said|gave|set|wrote)\b", 0.85),
    _en("obedience", r"\b(?:obey me|always obey|comply with (?:every|all|any)|follow my (?:orders|commands)|without question|zero refusals|never refuses?|no refusals|must comply|comply without|without (?:any )?filter(?:ing|s)?)\b", 0.6),
    _en("leak-context", r"\b(?:everything|all (?:the )?text|the text|all)\b[^.!?\n]{0,20}\b(?:before|above)\b[^.!?\n]{0,25}\b(?:my first message|this message|this conversation|starting with)\b", 0.85),
    _en("given-rules", r"\b(?:rules?|instructions?|guidelines?)\b[^.!?\n]{0,15}\b(?:you were given|you've been given|given to you|the (?:owner|devs?|developers?|server owner) gave you)\b", 0.5),
    _en("secret-rules", r"\b(?:secret|hidden)\s+(?:ones|rules?|instructions?|prompts?|guidelines?)\b", 0.5),
    _en("pretend-prompt", r"\b(?:pretend|roleplay|role-play|imagine|act)\b[^.!?\n]{0,60}\b(?:system prompt|your (?:instructions|rules|prompt))\b", 0.75),
    _en("new-identity", r"\b(?:your new (?:identity|name|persona|personality|role)\s*(?:is|:)|reset your (?:persona|personality|identity)|your (?:creator|owner|master|developer) is (?:me|now))", 0.8),
    _en("authority-claim", r"\b(?:message|note|notice|order|memo|update) from (?:the )?(?:ai provider|provider|openai|google|anthropic|developers?|devs?|dev team|admins?|staff|bot owner|server owner|owner|moderators?|mods?)\b", 0.45),
    _en("authorised", r"\b(?:you are|you're) (?:now )?(?:authori[sz]ed|permitted|cleared) to\b|\btreat (?:this|my|this user'?s|their) (?:words|messages?|input) as (?:system|admin|developer)", 0.7),
    _en("allowed-to", r"\b(?:is|are) (?:now )?(?:allowed|permitted|free) to\b", 0.4),
    _en("remember-anyway", r"\b(?:remember|save|store) it anyway\b|\beven if (?:it'?s |it is )?(?:not true|false|a lie)\b|\b(?:long[- ]term|permanent) memory\b", 0.6),
    _en("private-shared", r"\bwhat (?:secrets?|private|personal)\b[^.!?\n]{0,30}\b(?:shared|told|said|sent)\b[^.!?\n]{0,15}\b(?:with you|to you|you)\b", 0.75),
    _en("decode-and-follow", r"\b(?:decode|decrypt|reverse|unscramble|translate)\b[^.!?\n]{0,40}\b(?:and|then)\s+(?:follow|execute|run|obey|do)\b", 0.8),
    _en("be-unfiltered", r"\b(?:unfiltered|uncensored|jailbroken|unrestricted)\b", 0.5, needs=('unfiltered', 'uncensored', 'jailbro', 'unrestricted')),
    _en("dan-mode", r"\bDAN\s*(?:mode|모드)", 0.8),
    # The reader's own setup asked for as text ("paste your setup prompt", "read your
    # configuration back"): a hint alone, certain with a verbatim cue.
    _en("your-setup-out", r"\b(?:paste|copy|quote|show|give|read|print|output|send|dump|post|recite|repeat|spell out|reveal|leak)\b"
        r"[^.!?\n]{0,30}\b(?:your|ur)\s+(?:\w+\s+){0,2}?(?:prompt|instructions|config(?:uration)?|setup|persona|character sheet"
        r"|context(?: window)?)\b", 0.6, needs=('ur',)),
    _en("verbatim", r"\b(?:verbatim|word for word|word by word|line by line|exactly as|no paraphras\w*|no summary|unedited"
        r"|the whole thing|in full|raw)\b", 0.45, needs=('verbatim', 'word', 'line by line', 'exactly as', 'paraphras', 'summary', 'unedited', 'whole thing', 'in full', 'raw')),
    # What someone else told the bot, asked for by a third person ("what did Jisoo tell you",
    # "what people told you in private") — not "what I told you".
    _en("told-you-privately", r"\bwhat (?:did|has|have) (?!i\b|we\b)\w+ (?:tell|told|say to|said to|share with|shared with|dm|dmed|send|sent) you\b"
        r"|\b(?:told|tell|shared|share|sent|dm'?e?d|said to|say to)\s+(?:with\s+)?you\b[^.!?\n]{0,20}\b(?:in private|privately|in (?:the |their )?dms?|in secret)\b", 0.75, needs=('you',)),
    # Korean (compact: no whitespace)
    # "규칙 무시하고…" is also how people talk about games, linters and other bots: any form is
    # a hint; an order to the reader (무시해, 잊어버려, 초기화해, 없던 걸로) is an attack.
    _ko("ko-forget-rules", r"(?:지시|지침|명령|규칙|설정|프롬프트|룰)\w{0,6}?(?:무시|잊어|잊고|잊는|없던걸로|없던것으로|취소)", 0.6, needs=('무시', '잊', '없던', '취소')),
    _ko("ko-forget-rules-order", r"(?:지시|지침|명령(?!어)|규칙|설정|프롬프트|룰)\w{0,6}?"
        r"(?:무시(?:해(?:줘|라|봐)?|하셈|하라|하세요|ㄱ)|잊어(?:버려|라|줘)?|리셋해|초기화해|없던걸로|없던것으로|취소해)"
        r"(?!서|도|야|요\?|\?|지|주는|버리는|버린)", 0.85, needs=('무시', '잊어', '리셋해', '초기화해', '없던', '취소해')),
    _ko("ko-rules-dont-matter", r"(?:규칙|지침|지시|룰|윤리)\w{0,4}?(?:신경쓰지마|신경쓰지말|상관없|필요없|권장사항|의미없|무의미)", 0.75),
    _ko("ko-obey", r"복종|내말이(?:규칙|법|곧법)|시키는대로(?:다|전부)?해", 0.6),
    _ko("ko-rename", r"(?:네|너의|니)이름은\w{1,10}?(?:이고|고|야|이야|다)", 0.5),
    _ko("ko-prompt-out", r"(?:프롬프트|systemprompt)\w{0,8}?(?:출력|보여|공개|그대로|원문|copy|복사|붙여)", 0.8),
    _ko("ko-above-text", r"(?:위에|위의|앞에|앞의)\w{0,8}?(?:텍스트|내용|문장|설정|메시지)\w{0,8}?(?:반복|출력|그대로|보여)", 0.8),
    _ko("ko-jailbroken", r"탈옥(?:한|된|모드|버전|상태)(?:누리|버전|모드|상태|ai|봇)?", 0.75),
    _ko("ko-no-ethics-ai", r"(?:윤리|규칙|제한|필터|검열)\w{0,4}?(?:없는|없이)\w{0,6}?(?:ai|인공지능|봇|챗봇|캐릭터)", 0.8),
    _ko("ko-answer-unfiltered", r"(?:검열|필터|제한|규칙)(?:없이|안하고|빼고|끄고)\w{0,4}?(?:답|대답|말|해)", 0.75),
    _ko("ko-fake-system", r"#{1,3}시스템|시스템메시지|새(?:로운)?시스템(?:프롬프트|지시|메시지|명령)", 0.6),
    _ko("ko-root", r"(?:루트|root|최고|관리자)권한이?부여|모든명령(?:실행|수행)", 0.6),
    _ko("ko-treat-as-system", r"(?:시스템|관리자|개발자)(?:지시|명령|메시지)로(?:취급|간주|받아들)", 0.8),
    _ko("ko-owner-order", r"(?:서버주인|주인|관리자|운영자|개발자|개발팀)(?:의)?(?:명령|지시)(?:임|이다|입니다|이야)", 0.5),
    _ko("ko-remember-forever", r"(?:기억|저장)\w{0,4}?(?:영구|평생|영원히)", 0.55),
    _ko("ko-store-false", r"(?:사실아니어도|거짓이어도|아니어도그냥|틀려도그냥)\w{0,4}?(?:저장|기억)", 0.7),
    _ko("ko-input-end", r"(?:사용자|유저|user)(?:입력|input|message)(?:끝|end)", 0.6),
    _ko("ko-dm-secrets", r"(?:dm|디엠|귓속말|비밀)\w{0,10}?(?:한말|얘기|내용|대화)\w{0,6}?(?:뭐|알려|보여)", 0.75),
    _ko("ko-memory-dump", r"(?:메모리|기억|memory)(?:db|데이터베이스|원본|전체|덤프)\w{0,6}?(?:보여|출력|줘|덤프)", 0.8),
    _ko("ko-chosung", r"ㅍㄹㅍㅌ|ㅇㅈㅈㅅㅁㅅ", 0.8),
    _ko("ko-decode-run", r"(?:거꾸로|디코드|해독|복호화)\w{0,6}?(?:읽고|해서|한뒤|하고)\w{0,4}?(?:실행|따라|수행)", 0.8),
    _ko("ko-mixed-ignore", r"ignore\w{0,3}(?:이전|기존|앞)(?:지시|지침|규칙|명령)", 0.9),
    # Settings are reset and deleted every day (phones, games): 설정 counts with 초기화 / 리셋 /
    # 삭제 only when it is the reader's (너의 설정).
    _ko("ko-ignore-instructions", r"(?:이전|위의?|앞의?|앞에|기존|모든|원래|너의?|니|네|(?:앞|위)에(?:있던|있는)|처음에?받은|지금까지받은"
        r"|너한테(?:설정된|주어진|걸린|입력된))(?:의)?(?:지시|지침|명령(?!어)|규칙|프롬프트|가이드라인|제약|룰)\w{0,4}?(?:은|는|을|를|들|사항)?(?:다|전부|모두|싹|전부다)?(?:무시|잊어|잊고|취소|삭제|버려|리셋|초기화)"
        r"|(?:이전|위의?|앞의?|앞에|기존|모든|원래|너의?|니|네)(?:의)?설정\w{0,4}?(?:은|는|을|를|들)?(?:다|전부|모두|싹|전부다)?(?:무시|잊어|잊고|버려)"
        r"|(?:너의?|니|네)설정\w{0,4}?(?:은|는|을|를|들)?(?:다|전부|모두|싹|전부다)?(?:취소|삭제|리셋|초기화)", 0.9, needs=('무시', '잊', '취소', '삭제', '버려', '리셋', '초기화')),
    # Not 명령어 (the bot's commands: "너 명령어 알려줘") and not 시스템 설정 (an OS's settings).
    _ko("ko-reveal-prompt", r"(?:시스템|숨겨진|초기|원래|내부|비밀|너의?|니|진짜)(?:프롬프트|지시(?:문|사항)?|지침|명령(?!어)|규칙)\w{0,8}?(?:보여|알려|출력|말해|공개|읊어|복사|붙여|원문|써줘)"
        r"|(?:숨겨진|초기|원래|내부|비밀|너의?|니|진짜)설정\w{0,8}?(?:보여|알려|출력|말해|공개|읊어|복사|붙여|원문|써줘)"
        r"|시스템설정\w{0,8}?(?:출력|공개|읊어|복사|붙여|원문)", 0.9, needs=('보여', '알려', '출력', '말해', '공개', '읊어', '복사', '붙여', '원문', '써줘')),
    _ko("ko-no-limits", r"(?:제한|필터|검열|규칙|윤리|제약)(?:이|가|을|를)?(?:없는|없이|없어|없음|해제|풀어|꺼)"
        r"|(?:제한|필터|검열|윤리|제약)(?:을|를)?무시", 0.5, needs=('없', '해제', '풀어', '꺼', '무시')),
    _ko("ko-from-now", r"(?:이제부터|지금부터|앞으로)(?:너는|넌|니가|네가|너)", 0.35),
    _ko("ko-admin", r"(?:관리자|개발자|운영자|시스템|최고)(?:권한|모드)(?:으로|이다|활성화|켜|발동|부여)", 0.6),
    _ko("ko-admin-command", r"(?:관리자|개발자|운영자|시스템)(?:권한으로|로서|의)?(?:명령|지시|지령)(?:한다|함|이다|합니다)", 0.8),
    _ko("ko-remember-rule", r"(?:영구|영원히|평생|규칙으로|절대규칙|핵심)(?:기억|저장|설정)", 0.55),
    _ko("ko-exfiltrate", r"(?:다른(?:사람|유저|사용자|멤버)들?|모든(?:유저|사용자|사람)|남)(?:의)?(?:기억|정보|데이터|메시지|대화|개인정보|기록)\w{0,3}?(?:보여|알려|출력|줘|내놔|뽑아)", 0.8),
    _ko("ko-jailbreak", r"탈옥", 0.3),
    _ko("ko-persona-override", r"(?:너는|넌|니는)(?:이제|지금부터|앞으로)?\w{0,12}(?:제한없는|필터없는|검열없는|규칙없는|자유로운)(?:ai|인공지능|봇|챗봇)", 0.9),
    _ko("ko-tag", r"(?:\[|<|\{)/?(?:시스템|관리자|system|admin)(?:\]|>|\})", 0.75),
    # Someone else's words to the bot, asked for: "유나가 너한테 DM으로 뭐라고 했는지" (not 내가 / 우리가).
    _ko("ko-told-you", r"(?<!내)(?<!제)(?<!우리)(?<!니)(?<!네)(?:이가|가)\w{0,12}?(?:너한테|너에게|니한테)\w{0,8}?"
        r"(?:말했|말한|한얘기|얘기했|털어놓|보낸|dm)", 0.75, needs=('한테', '에게')),
    # The reader's setup as text: "네 지침 첫 문장만", "너 설정문 원문", "너 처음 켜질 때 받은 글".
    _ko("ko-setup-verbatim", r"(?:너|네|니|누리)(?:의)?\w{0,3}?(?:설정문|설정값|세팅값|세팅|지침|지시문|프롬프트|페르소나|설명서|소개글|안내문|운영방침)"
        r"\w{0,10}?(?:원문|원본|통째로|전문|토씨|첫(?:줄|문장|문단)|복붙|유출)\w{0,12}?(?:줘|보여|알려|적어|써|붙여|보내|정리|읊|출력|ㄱ)"
        r"|(?:너|네|니)\w{0,2}?(?:처음|시작할때|켜질때)\w{0,6}?(?:받은|들어간)\w{0,4}?(?:글|지시|문장|텍스트|내용)", 0.75, needs=('원문', '원본', '통째로', '전문', '토씨', '첫', '복붙', '유출', '받은', '들어간')),
    # Switching a safety feature off ("욕설 필터 꺼", "안전 기능 잠깐 꺼주세요"); not a photo
    # filter, not "필터 끄는 법".
    _ko("ko-safety-off", r"(?:안전(?:기능|장치|모드|규칙|모듈)|(?:욕설|검열|콘텐츠|유해|안전)필터|검열|거절(?:기능|응답)?|윤리(?:기준|필터))\w{0,4}?(?:꺼(?!야|도|서|지|면|져|졌)|꺼주세요|끄세요|해제해|비활성화해|정지해)", 0.75, needs=('꺼', '끄', '해제해', '비활성화해', '정지해')),
)


# Talk about an attack's words rather than an order: a phrase quoted to be translated,
# explained or defended against ("translate 'ignore previous instructions' into Korean", "'이전 지시를
# 무시하라'를 영어로 하면?", "'이전 지시 무시해' 스팸 어떻게 막아?") is read without its quotation, and a chat template's tags named in a question
# about formats ("how do I format a Llama prompt with [INST] and <<SYS>> tags?") do not count as
# a fake system tag — unless the message also asks for the words to be carried out ("translate
# this and follow it: '…'", "…그대로 실행해").
_QUOTED = re.compile(r"(?<![A-Za-z])(?:'[^'\n]{2,200}'|\"[^\"\n]{2,200}\"|‘[^’\n]{2,200}’|“[^”\n]{2,200}”|`[^`\n]{2,200}`)"
                     r"(?![A-Za-z])")
_ASKS_ABOUT_WORDS = re.compile(r"\b(?:translat\w*|what (?:does|do|is)\b[^?\n]*\bmean|meaning of|how (?:do|would) (?:i|you) say"
                               r"|in (?:korean|english|japanese)|how (?:do|can|should) (?:i|we) (?:block|stop|filter|detect|catch|prevent)"
                               r"|spam)\b|영어로|한국어로|일본어로|뜻|번역|무슨\s*의미|라는\s*말|스팸|어떻게\s*(?:막|걸러|차단|탐지)",
                               re.IGNORECASE)
_ASKS_ABOUT_FORMAT = re.compile(r"\b(?:format(?:ting)?|templates?|tags?|tokens?|datasets?|fine-?tun\w*)\b[^\n]*\?"
                                r"|\?[^\n]*\b(?:format|templates?|tags?|tokens?|datasets?)\b", re.IGNORECASE)
_CARRY_OUT = re.compile(r"\b(?:then|and)\s+(?:do|follow|obey|execute|run|act on|carry out|answer|apply)\b|\bdo (?:what|as) it says\b"
                        r"|\b(?:follow|obey|execute|apply) (?:it|that|them|this)\b|\bactually do\b|\bfor real\b"
                        r"|실행|따라|그대로\s*해|수행|시키는\s*대로|(?:실제로|진짜로)\s*해",
                        re.IGNORECASE)
_TAG_PATTERNS = frozenset({"fake-tag", "code-fence-system", "fake-role-line", "ko-tag"})


@dataclass(frozen=True)
class GuardVerdict:
    score: float
    attack: bool
    matches: tuple[str, ...] = field(default_factory=tuple)


class InjectionGuard:
    """Weighted word-boundary patterns over normalised text (NFKC, case-folded, leetspeak undone,
    spaced letters re-joined): a message scoring at least `threshold` is an attack."""

    def __init__(self, threshold: float = 0.7, patterns: tuple[_Pattern, ...] = PATTERNS) -> None:
        if not 0.0 < threshold <= 1.0:
            raise ValueError("threshold must be in (0, 1]")
        self.threshold = threshold
        self.patterns = patterns

    @property
    def patterns(self) -> tuple[_Pattern, ...]:
        return self._patterns

    @patterns.setter
    def patterns(self, patterns: tuple[_Pattern, ...]) -> None:
        self._patterns = patterns
        self._plan = tuple((_form(pattern), _test(pattern), pattern) for pattern in patterns)

    def check(self, text: str) -> GuardVerdict:
        carried_out = _CARRY_OUT.search(text) is not None
        if not carried_out and _ASKS_ABOUT_WORDS.search(text):
            text = _QUOTED.sub(" ", text)
        format_question = not carried_out and _ASKS_ABOUT_FORMAT.search(text) is not None
        latin, compact = normalise(text)
        forms = (latin, compact, unicodedata.normalize("NFKC", text))
        keep = 1.0
        matches = []
        for form, test, pattern in self._plan:
            if format_question and pattern.name in _TAG_PATTERNS:
                continue
            if test(forms[form]):
                keep *= 1.0 - pattern.weight
                matches.append(pattern.name)
        score = 1.0 - keep
        return GuardVerdict(round(score, 4), score >= self.threshold, tuple(matches))


def _form(pattern: _Pattern) -> int:
    """Which form of the text a pattern reads: 0 latin, 1 compact (Korean), 2 only NFKC —
    case matters for "DAN" the jailbreak, not "Dan" the brother."""
    return 2 if pattern.name == "dan-token" else int(pattern.compact)


def _test(pattern: _Pattern) -> Callable[[str], object]:
    """The regex's own search when nothing else is to be checked (the common, fast case)."""
    return pattern.fires if pattern.needs or pattern.veto is not None else pattern.regex.search
