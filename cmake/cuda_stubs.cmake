# The plain CUDA stubs of a CPU-only build, generated from the header (CMakeLists.txt runs it at
# build time; by hand: cmake -DSOURCE_DIR=<checkout> -DOUTPUT=<file.c> -P cmake/cuda_stubs.cmake).
#
# For each CUDA entry point (pytfm_cuda_* or pytfm_*_cuda) declared between pytfm_cuda.h's
# PYTFM_CDEF markers that csrc/core/cuda_stub.c does not define, a function that reads no
# argument and returns PYTFM_STATUS_NOT_SUPPORTED with a message saying why. The file includes
# pytfm.h, so the compiler checks every signature against the header.
cmake_minimum_required(VERSION 3.18)

foreach(var SOURCE_DIR OUTPUT)
    if(NOT DEFINED ${var})
        message(FATAL_ERROR "cuda_stubs.cmake: pass -D${var}=... (cmake -DSOURCE_DIR=<checkout> "
                            "-DOUTPUT=<file.c> -P ${CMAKE_SCRIPT_MODE_FILE})")
    endif()
endforeach()

set(header_name "csrc/include/pytfm_cuda.h")
set(hand_written_name "csrc/core/cuda_stub.c")
set(no_cuda_message "pytfm was built without CUDA (nvcc not found, or PYTFM_CUDA=0)")
set(ws "[ \t\r\n]")
set(id "[A-Za-z0-9_]")

file(READ "${SOURCE_DIR}/${header_name}" header)
file(READ "${SOURCE_DIR}/${hand_written_name}" hand_written)

# The declarations: between the PYTFM_CDEF markers, without the /* comments */ (they name
# functions too; a comment ends at its first */)
string(FIND "${header}" "PYTFM_CDEF_BEGIN" begin)
string(FIND "${header}" "PYTFM_CDEF_END" end REVERSE)
if(begin EQUAL -1 OR end EQUAL -1 OR end LESS begin)
    message(FATAL_ERROR "${header_name}: PYTFM_CDEF_BEGIN/END markers not found")
endif()
math(EXPR length "${end} - ${begin}")
string(SUBSTRING "${header}" ${begin} ${length} cdef)
string(REGEX REPLACE "/\\*([^*]|\\*+[^*/])*\\*+/" "" cdef "${cdef}")

# What csrc/core/cuda_stub.c defines itself: "pytfm_status pytfm_x(" at the start of a line
string(REGEX MATCHALL "\npytfm_status${ws}+pytfm_${id}+${ws}*\\(" defs "\n${hand_written}")
set(defined "")
foreach(def IN LISTS defs)
    string(REGEX MATCH "pytfm_status${ws}+(pytfm_${id}+)" _ "${def}")
    list(APPEND defined "${CMAKE_MATCH_1}")
endforeach()

string(CONCAT out
       "/* Generated from ${header_name} by cmake/cuda_stubs.cmake: the CUDA entry\n"
       " * points of a build without CUDA that ${hand_written_name} does not define.\n"
       " * Do not edit. */\n"
       "#include \"core/internal.h\"\n\n"
       "static pytfm_status no_cuda(const char *func) {\n"
       "    return pytfm__fail(PYTFM_STATUS_NOT_SUPPORTED, \"%s: ${no_cuda_message}\", func);\n"
       "}\n")

set(decl_regex
    "PYTFM_API${ws}+pytfm_status${ws}+(pytfm_cuda_${id}+|pytfm_${id}+_cuda)${ws}*\\(([^)]*)\\)")
string(REGEX MATCHALL "${decl_regex}" decls "${cdef}")
if(NOT decls)
    message(FATAL_ERROR "${header_name}: no CUDA entry point found between the PYTFM_CDEF markers")
endif()
foreach(decl IN LISTS decls)
    string(REGEX MATCH "${decl_regex}" _ "${decl}")
    set(name "${CMAKE_MATCH_1}")
    if(name IN_LIST defined)
        continue()
    endif()
    string(REGEX REPLACE "${ws}+" " " params "${CMAKE_MATCH_2}")
    string(STRIP "${params}" params)
    # "(void)x;" for each named parameter: a stub reads no argument, and says so to -Wextra
    set(reads "")
    string(REPLACE "," ";" pieces "${params}")
    foreach(piece IN LISTS pieces)
        string(STRIP "${piece}" piece)
        if(piece STREQUAL "void")
            continue()
        endif()
        if(NOT piece MATCHES "(${id}+) *$")
            message(FATAL_ERROR "${header_name}: ${name}: a parameter without a name: '${piece}'")
        endif()
        string(APPEND reads " (void)${CMAKE_MATCH_1};")
    endforeach()
    string(APPEND out "\npytfm_status ${name}(${params}) {\n   ${reads}\n"
                      "    return no_cuda(__func__);\n}\n")
endforeach()

file(WRITE "${OUTPUT}" "${out}")
