# shellcheck shell=bash
# bash completion for pvcli: source it (or copy it to /etc/bash_completion.d/pvcli).
_pvcli() {
    local cur=${COMP_WORDS[COMP_CWORD]} noun="" verb="" w i
    local -A verbs=(
        [cluster]="create get list update delete health metrics upgrade upgrade-status"
        [node]="add get list remove drain cordon uncordon"
        [pool]="create get list delete stats"
        [volume]="create get list resize clone delete"
        [snapshot]="create get list restore delete"
        [op]="get list wait cancel watch"
        [pod]="add get list remove"
        [workload]="deploy list get remove logs exec"
        [image]="build list cache remove"
        [capacity]="calc"
    )
    for ((i = 1; i < COMP_CWORD; i++)); do
        w=${COMP_WORDS[i]}
        case $w in
            --endpoint | -o | --output | --timeout | --tls-ca | --tls-cert | --tls-key | --user | --password) ((i++)) ;;
            -*) ;;
            *) if [[ -z $noun ]]; then noun=$w; elif [[ -z $verb ]]; then verb=$w; fi ;;
        esac
    done
    if [[ $cur == -* ]]; then
        mapfile -t COMPREPLY < <(compgen -W "--endpoint -o -q --quiet --detach --timeout --tls-ca --tls-cert --tls-key --user --password --help" -- "$cur")
    elif [[ ${COMP_WORDS[COMP_CWORD - 1]} == -o || ${COMP_WORDS[COMP_CWORD - 1]} == --output ]]; then
        mapfile -t COMPREPLY < <(compgen -W "table json" -- "$cur")
    elif [[ -z $noun ]]; then
        mapfile -t COMPREPLY < <(compgen -W "${!verbs[*]}" -- "$cur")
    elif [[ -z $verb ]]; then
        mapfile -t COMPREPLY < <(compgen -W "${verbs[$noun]}" -- "$cur")
    fi
}
complete -F _pvcli pvcli
