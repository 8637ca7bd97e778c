# Embeds a file as a C byte array:
#   cmake -DIN=file -DOUT=file.c -DNAME=symbol [-DPRELUDE=file] -P embed.cmake
# Defines `const unsigned char NAME[]` (NUL-terminated, so text can be used as a C string)
# and `const size_t NAME_len` (without the NUL). With PRELUDE, the text embedded is IN's first
# line, then PRELUDE's text, then the rest of IN (a Redis function library keeps its
# "#!lua name=..." line first); it is also written to OUT.lua, to read what Redis is given.
if(PRELUDE)
  file(READ ${IN} text)
  file(READ ${PRELUDE} prelude)
  string(FIND "${text}" "\n" nl)
  if(nl LESS 0)
    message(FATAL_ERROR "${IN}: no first line to put ${PRELUDE} after")
  endif()
  math(EXPR rest_at "${nl} + 1")
  string(SUBSTRING "${text}" 0 ${rest_at} first)
  string(SUBSTRING "${text}" ${rest_at} -1 rest)
  file(WRITE ${OUT}.lua "${first}${prelude}\n${rest}")
  set(IN ${OUT}.lua)
endif()
file(READ ${IN} hex HEX)
string(LENGTH "${hex}" hexlen)
math(EXPR len "${hexlen} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)" "\\1\n" body "${body}")
file(WRITE ${OUT} "/* generated from ${IN}; do not edit */\n#include <stddef.h>\nconst unsigned char ${NAME}[] = {\n${body}0x00};\nconst size_t ${NAME}_len = ${len};\n")
